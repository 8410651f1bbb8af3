//! The lock table: one deterministic state machine.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ops::Bound;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::command::{Acquire, Command, Effect};
use crate::error::{EngineError, SnapshotError};
use crate::inspect::{HolderInfo, ListPage, LockInfo, SessionInfo, WaiterInfo};
use crate::name::validate_name;
use crate::planted::{self, Defect};
use crate::snapshot::{
    EndingSnapshot, HoldSnapshot, LockSnapshot, SessionSnapshot, Snapshot, WaiterSnapshot,
};
use crate::types::{ClientInfo, Limits, LostReason, Millis, Mode, RequestId, SessionId, Wait};

#[cfg(feature = "serde")]
mod encode;
mod slab;

use slab::Slab;

/// Index of a lock in the slab. Internal only: ids are not stable across
/// snapshots, so nothing observable may depend on their order.
type LockId = u32;
type WaiterKey = (SessionId, RequestId);

/// The lock engine: holds, queues, sessions, leases and fencing tokens.
///
/// Drive it with [`Engine::apply`]; ask [`Engine::next_deadline`] when to come
/// back and [`Engine::due`] which time-driven commands to apply then.
#[derive(Debug, Default)]
pub struct Engine {
    limits: Limits,
    /// Highest fencing token handed out. One counter for all locks, so tokens
    /// stay unique and increasing even when a free lock's entry is dropped.
    last_token: u64,
    /// Ordered, so that listings and snapshots walk names in order (a page
    /// of a listing costs O(log n + page), a snapshot needs no sort).
    names: BTreeMap<Arc<str>, LockId>,
    /// Shared with a [`FrozenEngine`] while one is alive, in chunks (see
    /// [`Slab`]): a chunk or an entry changed meanwhile is copied first, so
    /// freezing costs a reference per chunk, not a copy of the table.
    locks: Slab,
    free_ids: Vec<LockId>,
    sessions: FxHashMap<SessionId, Session>,
    /// One copy of each client info the sessions share.
    client_infos: ClientInfos,
    /// Sessions that ended with more holds and waits than one step gives up
    /// ([`Limits::session_end_step`]): gone for their clients, they give up
    /// the rest a step at a time ([`Command::ContinueSessionEnd`]).
    ending: BTreeMap<SessionId, Ending>,
    waiters: FxHashMap<WaiterKey, Waiter>,
    timers: BTreeSet<(Millis, Timer)>,
    /// Sessions are timed by the caller ([`Engine::time_sessions_by_caller`]):
    /// `timers` holds none of theirs.
    sessions_timed_by_caller: bool,
    /// Reused buffers (always empty between commands), so that the hot path of
    /// an uncontended acquire / release allocates nothing but what it returns.
    scratch: Scratch,
}

/// The client infos of the sessions, one copy of each: a client that opens
/// many sessions names itself the same in all of them, and an idle session
/// should not keep a copy of two strings of its own.
#[derive(Debug, Default)]
struct ClientInfos {
    shared: FxHashSet<Arc<ClientInfo>>,
    /// How many the last sweep kept: the next is due at twice that.
    kept: usize,
}

impl ClientInfos {
    /// The copy of `info` the sessions share.
    fn share(&mut self, info: ClientInfo) -> Arc<ClientInfo> {
        if let Some(shared) = self.shared.get(&info) {
            return Arc::clone(shared);
        }
        if self.shared.len() >= (2 * self.kept).max(64) {
            // Forget those no session (nor a frozen snapshot) has any more:
            // amortized O(1) per new info, and the set stays within twice
            // the infos in use.
            self.shared.retain(|info| Arc::strong_count(info) > 1);
            self.kept = self.shared.len();
        }
        let info = Arc::new(info);
        self.shared.insert(Arc::clone(&info));
        info
    }
}

#[derive(Debug, Default)]
struct Scratch {
    /// What an acquire's first look found for each of its names.
    found: Vec<Option<LockId>>,
    /// Lock ids of an acquire being granted at once.
    locks: Vec<LockId>,
    /// [`Engine::settle`]'s work list and the locks it looked at.
    work: Vec<LockId>,
    seen: Vec<LockId>,
}

#[derive(Debug, Clone)]
struct LockEntry {
    name: Arc<str>,
    holders: Holders,
    queue: VecDeque<WaiterKey>,
    delay_until: Option<Millis>,
}

#[derive(Debug, Clone)]
struct Hold {
    session: SessionId,
    owner: Box<str>,
    mode: Mode,
    token: u64,
    count: u32,
    lock_time: Millis,
    lease_until: Option<Millis>,
    /// In ms, as `u32` so that it shares a word with `count` (a hold is 72
    /// bytes instead of 80). See [`compact_delay`].
    lock_delay: u32,
}

/// A lock-delay for [`Hold::lock_delay`]. Acquire checks it against
/// [`Limits::max_lock_delay`] (60 s by default); a limit configured above
/// `u32::MAX` ms (49 days) would be capped there.
fn compact_delay(ms: Millis) -> u32 {
    u32::try_from(ms).unwrap_or(u32::MAX)
}

/// The holders of one lock, oldest first. Nearly every lock has exactly one
/// holder, so that one is stored inline: a plain `Vec` allocated room for four
/// holders on the first push, the largest part of the memory of a held lock.
#[derive(Debug, Clone)]
enum Holders {
    One(Hold),
    Many(Vec<Hold>),
}

impl Default for Holders {
    fn default() -> Self {
        Holders::Many(Vec::new())
    }
}

impl Deref for Holders {
    type Target = [Hold];

    fn deref(&self) -> &[Hold] {
        match self {
            Holders::One(hold) => std::slice::from_ref(hold),
            Holders::Many(holds) => holds,
        }
    }
}

impl DerefMut for Holders {
    fn deref_mut(&mut self) -> &mut [Hold] {
        match self {
            Holders::One(hold) => std::slice::from_mut(hold),
            Holders::Many(holds) => holds,
        }
    }
}

impl Holders {
    /// Appends a holder (the newest).
    fn push(&mut self, hold: Hold) {
        match self {
            Holders::Many(holds) if holds.is_empty() => *self = Holders::One(hold),
            Holders::Many(holds) => holds.push(hold),
            Holders::One(_) => {
                let Holders::One(first) = std::mem::take(self) else {
                    unreachable!()
                };
                *self = Holders::Many(vec![first, hold]);
            }
        }
    }

    /// Removes and returns the holder at `index`, keeping the order of the rest.
    fn remove(&mut self, index: usize) -> Hold {
        match self {
            Holders::Many(holds) => holds.remove(index),
            Holders::One(_) => {
                assert_eq!(index, 0, "holder index out of bounds");
                let Holders::One(hold) = std::mem::take(self) else {
                    unreachable!()
                };
                hold
            }
        }
    }
}

#[derive(Debug, Clone)]
struct Waiter {
    locks: Vec<LockId>,
    owner: Box<str>,
    mode: Mode,
    /// Whether the request allows re-entry: checked again at grant time, since
    /// the owner may have come to hold the lock while this request waited.
    reentrant: bool,
    lease: Option<Millis>,
    lock_delay: Millis,
    since: Millis,
    deadline: Option<Millis>,
}

/// A request being granted: from the acquire path directly, or a waiter.
struct Grant<'a> {
    session: SessionId,
    locks: &'a [LockId],
    owner: Box<str>,
    mode: Mode,
    lease: Option<Millis>,
    lock_delay: Millis,
}

#[derive(Debug)]
struct Session {
    ttl: Millis,
    expires_at: Millis,
    /// Shared with the snapshots frozen from it: a freeze takes a
    /// reference, not a copy of two strings per session.
    info: Arc<ClientInfo>,
    /// Locks where this session has at least one hold.
    holds: FxHashSet<LockId>,
    waiting: FxHashSet<RequestId>,
    /// Names over all of `waiting` (each may become a hold): kept as a count
    /// so that the holds limit is checked in O(1) however long the queue.
    queued_names: usize,
}

/// What is left of a session's end ([`Engine::ending`]): its holds and
/// waits, kept up to date as a live session's are, until a step of its end
/// or anything else (a lease, a timeout) has taken the last of them.
#[derive(Debug)]
struct Ending {
    reason: LostReason,
    /// When the session ended: when its next step falls due.
    since: Millis,
    /// Who the client was: its remaining holds still show it.
    info: Arc<ClientInfo>,
    /// Locks where it still has at least one hold.
    holds: FxHashSet<LockId>,
    /// Its waits not dropped yet.
    waiting: FxHashSet<RequestId>,
}

impl Session {
    fn add_waiter(&mut self, request: RequestId, names: usize) {
        if self.waiting.insert(request) {
            self.queued_names += names;
        }
    }

    fn remove_waiter(&mut self, request: RequestId, names: usize) {
        if self.waiting.remove(&request) {
            self.queued_names -= names;
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    Session(SessionId),
    Lease(LockId, u64),
    Waiter(SessionId, RequestId),
    LockDelay(LockId),
}

/// A time-driven command applies only if the deadline it was decided from has
/// passed and the current deadline is not later: a renewal, heartbeat or
/// grace applied in between moved it later, and the command is stale.
///
/// "Not later" rather than "equal": heartbeats are not logged, so a replay
/// (of the log after a restart) sees an earlier deadline than the one the
/// expiry was decided from, and must still apply it. Heartbeats and graces
/// only ever move a session's deadline later, so a deadline that is earlier
/// than the decided one can only be such a replay.
fn check_deadline(current: Millis, decided: Millis, now: Millis) -> Result<(), EngineError> {
    let not_later = match planted::active(Defect::DeadlineByEquality) {
        true => current == decided,
        false => current <= decided,
    };
    if (not_later && decided <= now) || planted::active(Defect::NoDeadlineCheck) {
        Ok(())
    } else {
        Err(EngineError::NotDue)
    }
}

impl LockEntry {
    fn hold_of(&self, session: SessionId, owner: &str) -> Option<usize> {
        self.holders
            .iter()
            .position(|h| h.session == session && &*h.owner == owner)
    }

    /// Whether current holders (ignoring the queue) leave room for `mode`.
    fn holders_admit(&self, mode: Mode) -> bool {
        match mode {
            Mode::Exclusive => self.holders.is_empty(),
            Mode::Shared => self.holders.iter().all(|h| h.mode == Mode::Shared),
            Mode::Semaphore { permits } => {
                self.holders.iter().all(|h| h.mode == mode) && self.holders.len() < permits as usize
            }
        }
    }

    fn delayed(&self, now: Millis) -> bool {
        self.delay_until.is_some_and(|until| until > now)
    }

    fn is_idle(&self) -> bool {
        self.holders.is_empty() && self.queue.is_empty() && self.delay_until.is_none()
    }
}

impl Engine {
    /// An empty engine with the given limits.
    pub fn new(limits: Limits) -> Self {
        Engine {
            limits,
            ..Engine::default()
        }
    }

    /// The limits this engine enforces.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The fencing high-water mark: the highest token ever granted. A durable
    /// store persists it; every later grant gets a larger token.
    pub fn last_token(&self) -> u64 {
        self.last_token
    }

    /// Makes every later grant's token larger than `floor` (nothing changes if
    /// tokens are past it already). For a store that lost part of its history:
    /// it no longer knows every token it handed out, only a bound on them, and
    /// a token must never be handed out twice.
    pub fn raise_token_floor(&mut self, floor: u64) {
        self.last_token = self.last_token.max(floor);
    }

    /// Applies one command at time `now`, appending what happened to `effects`.
    ///
    /// On `Err` nothing changed and nothing was appended.
    pub fn apply(
        &mut self,
        now: Millis,
        command: Command,
        effects: &mut Vec<Effect>,
    ) -> Result<(), EngineError> {
        self.apply_cow(now, Cow::Owned(command), effects)
    }

    /// [`apply`](Self::apply) for a caller that keeps the command, as a
    /// replicated log keeps its records: only what the engine stores (an
    /// acquire's names and owner, a session's client info) is copied.
    pub fn apply_borrowed(
        &mut self,
        now: Millis,
        command: &Command,
        effects: &mut Vec<Effect>,
    ) -> Result<(), EngineError> {
        self.apply_cow(now, Cow::Borrowed(command), effects)
    }

    fn apply_cow(
        &mut self,
        now: Millis,
        command: Cow<'_, Command>,
        effects: &mut Vec<Effect>,
    ) -> Result<(), EngineError> {
        match &*command {
            Command::OpenSession { .. } => {
                let Command::OpenSession { session, ttl, info } = command.into_owned() else {
                    unreachable!("matched above")
                };
                self.open_session(now, session, ttl, info)
            }
            &Command::Heartbeat { session } => self.heartbeat(now, session),
            &Command::CloseSession { session } => {
                self.end_session(now, session, LostReason::SessionClosed, effects)
            }
            &Command::ExpireSession { session, deadline } => {
                let current = self
                    .sessions
                    .get(&session)
                    .ok_or(EngineError::UnknownSession(session.0))?
                    .expires_at;
                check_deadline(current, deadline, now)?;
                self.end_session(now, session, LostReason::SessionExpired, effects)
            }
            &Command::ContinueSessionEnd {
                session,
                ref waits,
                ref holds,
            } => self.continue_end(now, session, waits, holds, effects),
            Command::Acquire(_) => {
                let Command::Acquire(acquire) = command.into_owned() else {
                    unreachable!("matched above")
                };
                self.acquire(now, acquire, effects)
            }
            &Command::Cancel { session, request } => {
                self.check_not_ending(session)?;
                self.remove_waiter(now, (session, request), None, effects)
            }
            &Command::TimeoutWaiter { session, request } => {
                let key = (session, request);
                if self.waiters.contains_key(&key) {
                    // An ended session's client is told nothing more.
                    let told = (!self.ending.contains_key(&session))
                        .then_some(Effect::TimedOut { session, request });
                    self.remove_waiter(now, key, told, effects)?;
                }
                Ok(())
            }
            &Command::Release {
                session,
                ref owner,
                ref name,
                token,
            } => {
                self.check_not_ending(session)?;
                self.release(now, session, owner, name, token, effects)
            }
            &Command::Renew {
                session,
                ref owner,
                ref name,
                token,
                lease,
            } => {
                self.check_not_ending(session)?;
                self.renew(now, session, owner, name, token, lease)
            }
            &Command::SetHoldCount {
                session,
                ref owner,
                ref name,
                token,
                count,
            } => {
                self.check_not_ending(session)?;
                self.set_hold_count(session, owner, name, token, count)
            }
            &Command::ExpireHold {
                ref name,
                token,
                deadline,
            } => self.expire_hold(now, name, token, deadline, effects),
            &Command::EndLockDelay { ref name, deadline } => {
                // `due()` lists this command from the timers as they were; an
                // abnormal loss applied since (e.g. a driver that woke up late
                // applies an ExpireSession due before it) may have extended the
                // delay, and a stale command must not end the new, longer one.
                let &id = self.names.get(name.as_str()).ok_or(EngineError::NotDue)?;
                let current = self.lock(id).delay_until.ok_or(EngineError::NotDue)?;
                check_deadline(current, deadline, now)?;
                self.lock_mut(id).delay_until = None;
                self.timers.remove(&(current, Timer::LockDelay(id)));
                self.settle(now, &[id], effects);
                Ok(())
            }
            &Command::GrantGrace { grace } => {
                self.grant_grace(now, grace);
                Ok(())
            }
            Command::ForceRelease { name } => self.force_release(now, name, effects),
        }
    }

    /// About how much work applying `command` takes, counted in locks and
    /// waits touched: a session's end releases its holds and drops its waits
    /// at once if they are at most
    /// [`Limits::session_end_step`](crate::Limits::session_end_step), else in
    /// later steps of about that many; anything else is 1. A caller that
    /// bounds its work per step (the server, per log entry) counts commands
    /// by this, so that several sessions ending at once are spread over
    /// several steps.
    pub fn work_of(&self, command: &Command) -> usize {
        match command {
            Command::CloseSession { session } | Command::ExpireSession { session, .. } => {
                1 + self.sessions.get(session).map_or(0, |s| {
                    let work = s.holds.len() + s.queued_names;
                    if self.ends_at_once(s) {
                        work
                    } else {
                        0
                    }
                })
            }
            Command::ContinueSessionEnd { waits, holds, .. } => (waits.len() + holds.len()).max(1),
            _ => 1,
        }
    }

    /// When the next time-driven command falls due, if any.
    pub fn next_deadline(&self) -> Option<Millis> {
        let timer = self.timers.first().map(|(at, _)| *at);
        let ending = self.ending.values().map(|e| e.since).min();
        timer.into_iter().chain(ending).min()
    }

    /// The time-driven commands due at `now`: the next step of every session
    /// still ending, then expiries, waiter timeouts and ends of lock-delay in
    /// deadline order. The engine does not apply them itself: the caller
    /// applies (and logs) each, so replay never re-decides time.
    pub fn due(&self, now: Millis) -> Vec<Command> {
        self.due_at_most(now, usize::MAX)
    }

    /// The first `max` of [`Engine::due`]: a caller that bounds its work per
    /// step takes the rest (still due) the next time, and pays for listing
    /// only what it applies.
    pub fn due_at_most(&self, now: Millis, max: usize) -> Vec<Command> {
        let steps = self
            .ending
            .iter()
            .filter(|(_, e)| e.since <= now)
            .map(|(&session, ending)| self.next_step(session, ending));
        let timers = self
            .timers
            .range(..=(now, Timer::LockDelay(LockId::MAX)))
            .map(|&(deadline, timer)| match timer {
                Timer::Session(session) => Command::ExpireSession { session, deadline },
                Timer::Lease(id, token) => Command::ExpireHold {
                    name: self.lock(id).name.to_string(),
                    token,
                    deadline,
                },
                Timer::Waiter(session, request) => Command::TimeoutWaiter { session, request },
                Timer::LockDelay(id) => Command::EndLockDelay {
                    name: self.lock(id).name.to_string(),
                    deadline,
                },
            });
        steps.chain(timers).take(max).collect()
    }

    /// [`Command::GrantGrace`]: pushes every session, lease and lock-delay
    /// deadline to at least `now + grace` (sessions `now + max(ttl, grace)`).
    /// Rebuilds the timer set once instead of moving entries one by one.
    fn grant_grace(&mut self, now: Millis, grace: Millis) {
        if planted::active(Defect::NoGrace) {
            return;
        }
        let floor = now.saturating_add(grace);
        for session in self.sessions.values_mut() {
            let floor = now.saturating_add(session.ttl.max(grace));
            session.expires_at = session.expires_at.max(floor);
        }
        for lock in self.locks.entries_mut() {
            let lock = Arc::make_mut(lock);
            for hold in lock.holders.iter_mut() {
                if let Some(until) = hold.lease_until.as_mut() {
                    *until = (*until).max(floor);
                }
            }
            if let Some(until) = lock.delay_until.as_mut() {
                *until = (*until).max(floor);
            }
        }
        let moved: Vec<(Millis, Timer)> = std::mem::take(&mut self.timers)
            .into_iter()
            .map(|(at, timer)| {
                let at = match timer {
                    Timer::Session(id) => self.sessions[&id].expires_at,
                    Timer::Lease(id, token) => self
                        .lock(id)
                        .holders
                        .iter()
                        .find(|h| h.token == token)
                        .and_then(|h| h.lease_until)
                        .unwrap_or(at),
                    Timer::LockDelay(id) => self.lock(id).delay_until.unwrap_or(at),
                    Timer::Waiter(..) => at,
                };
                (at, timer)
            })
            .collect();
        self.timers = moved.into_iter().collect();
    }

    // ----- sessions -----

    fn open_session(
        &mut self,
        now: Millis,
        id: SessionId,
        ttl: Millis,
        info: ClientInfo,
    ) -> Result<(), EngineError> {
        if id == SessionId::NONE || self.sessions.contains_key(&id) || self.ending.contains_key(&id)
        {
            return Err(EngineError::SessionExists(id.0));
        }
        self.check_range("session TTL", ttl, self.limits.min_ttl, self.limits.max_ttl)?;
        let expires_at = now + ttl;
        self.sessions.insert(
            id,
            Session {
                ttl,
                expires_at,
                info: self.client_infos.share(info),
                holds: FxHashSet::default(),
                waiting: FxHashSet::default(),
                queued_names: 0,
            },
        );
        if !self.sessions_timed_by_caller {
            self.timers.insert((expires_at, Timer::Session(id)));
        }
        Ok(())
    }

    fn heartbeat(&mut self, now: Millis, id: SessionId) -> Result<(), EngineError> {
        let session = self
            .sessions
            .get_mut(&id)
            .ok_or(EngineError::UnknownSession(id.0))?;
        let old = session.expires_at;
        // Never earlier: a grace may have given the session more than a TTL.
        session.expires_at = old.max(now + session.ttl);
        let new = session.expires_at;
        if !self.sessions_timed_by_caller {
            self.timers.remove(&(old, Timer::Session(id)));
            self.timers.insert((new, Timer::Session(id)));
        }
        Ok(())
    }

    /// Ends a session: it is gone at once (no heartbeat, request, resume or
    /// reuse of its id is accepted). Its waits and holds go with it if they
    /// are at most [`Limits::session_end_step`]; more are given up in later
    /// steps ([`Command::ContinueSessionEnd`]).
    fn end_session(
        &mut self,
        now: Millis,
        id: SessionId,
        reason: LostReason,
        effects: &mut Vec<Effect>,
    ) -> Result<(), EngineError> {
        let session = self
            .sessions
            .remove(&id)
            .ok_or(EngineError::UnknownSession(id.0))?;
        self.timers
            .remove(&(session.expires_at, Timer::Session(id)));
        if !self.ends_at_once(&session) {
            let ending = Ending {
                reason,
                since: now,
                info: session.info,
                holds: session.holds,
                waiting: session.waiting,
            };
            self.ending.insert(id, ending);
            return Ok(());
        }
        let mut touched = Vec::new();

        // Sorted so that the outcome never depends on hash order.
        let mut requests: Vec<RequestId> = session.waiting.into_iter().collect();
        requests.sort_unstable();
        for request in requests {
            let waiter = self.take_waiter((id, request));
            touched.extend(waiter.locks);
        }

        let mut holds: Vec<(u64, LockId)> = session
            .holds
            .iter()
            .flat_map(|&lock| {
                self.lock(lock)
                    .holders
                    .iter()
                    .filter(|h| h.session == id)
                    .map(move |h| (h.token, lock))
            })
            .collect();
        holds.sort_unstable();
        let abnormal = reason == LostReason::SessionExpired;
        for (token, lock) in holds {
            let index = self
                .lock(lock)
                .holders
                .iter()
                .position(|h| h.token == token)
                .expect("hold");
            self.drop_hold(now, lock, index, Some(reason), abnormal, effects);
            touched.push(lock);
        }
        self.settle(now, &touched, effects);
        Ok(())
    }

    /// Whether a session's end takes one step: it holds and waits for at
    /// most [`Limits::session_end_step`] locks.
    fn ends_at_once(&self, session: &Session) -> bool {
        session.holds.len() + session.queued_names <= self.limits.session_end_step
    }

    /// The next step of an ended session's end: up to
    /// [`Limits::session_end_step`] of its waits, then of its holds (all of
    /// its holds of a lock together), in whatever order this engine keeps
    /// them: the command names them, so replicas need not agree on an order.
    fn next_step(&self, session: SessionId, ending: &Ending) -> Command {
        let step = self.limits.session_end_step.max(1);
        let waits: Vec<RequestId> = ending.waiting.iter().copied().take(step).collect();
        let mut holds = Vec::new();
        for &lock in &ending.holds {
            if waits.len() + holds.len() >= step {
                break;
            }
            let entry = self.lock(lock);
            holds.extend(
                entry
                    .holders
                    .iter()
                    .filter(|h| h.session == session)
                    .map(|h| (entry.name.to_string(), h.token)),
            );
        }
        Command::ContinueSessionEnd {
            session,
            waits,
            holds,
        }
    }

    /// A step of a session's end: drops the waits and releases the holds it
    /// names (lost, with lock-delay if the session expired), skipping any
    /// that are gone, and grants what that frees. The end is over once the
    /// session neither holds nor waits.
    fn continue_end(
        &mut self,
        now: Millis,
        id: SessionId,
        waits: &[RequestId],
        holds: &[(String, u64)],
        effects: &mut Vec<Effect>,
    ) -> Result<(), EngineError> {
        let reason = self.ending.get(&id).ok_or(EngineError::NotDue)?.reason;
        let abnormal = reason == LostReason::SessionExpired;
        let mut touched = Vec::new();
        for &request in waits {
            if self.waiters.contains_key(&(id, request)) {
                touched.extend(self.take_waiter((id, request)).locks);
                if let Some(ending) = self.ending.get_mut(&id) {
                    ending.waiting.remove(&request);
                }
            }
        }
        for (name, token) in holds {
            let Some(&lock) = self.names.get(name.as_str()) else {
                continue;
            };
            let mut held = self.lock(lock).holders.iter();
            if let Some(index) = held.position(|h| h.token == *token && h.session == id) {
                self.drop_hold(now, lock, index, Some(reason), abnormal, effects);
                touched.push(lock);
            }
        }
        if self
            .ending
            .get(&id)
            .is_some_and(|e| e.holds.is_empty() && e.waiting.is_empty())
        {
            self.ending.remove(&id);
        }
        self.settle(now, &touched, effects);
        Ok(())
    }

    /// Refuses a client's request (release, renew, cancel) on behalf of a
    /// session that has ended but still gives up its holds.
    fn check_not_ending(&self, session: SessionId) -> Result<(), EngineError> {
        match self.ending.contains_key(&session) {
            true => Err(EngineError::UnknownSession(session.0)),
            false => Ok(()),
        }
    }

    // ----- acquire -----

    /// Refuses an acquire that would take `session` past its holds limit.
    ///
    /// Queued requests count too, since each becomes holds when granted:
    /// otherwise a session could pass the limit by queueing. Each queued name
    /// counts once per request (even one the session already holds or queues
    /// for in another request), so the check is O(1) from a counter: walking
    /// the queue made every acquire of a session with many waiters slower,
    /// and held the engine thread for seconds at tens of thousands.
    fn check_holds_limit(&self, session: SessionId, new_holds: usize) -> Result<(), EngineError> {
        let limit = self.limits.max_holds_per_session;
        let entry = &self.sessions[&session];
        if entry.holds.len() + new_holds + entry.queued_names > limit {
            return Err(EngineError::LimitReached {
                what: "holds per session",
                limit: limit as u64,
            });
        }
        Ok(())
    }

    fn acquire(
        &mut self,
        now: Millis,
        a: Acquire,
        effects: &mut Vec<Effect>,
    ) -> Result<(), EngineError> {
        let key = (a.session, a.request);
        self.validate_acquire(&a)?;

        // Look at every lock before touching any: an error must change nothing.
        // Remember what was found, so that each name is looked up only once (an
        // error below drops the buffer; the next acquire makes a new one).
        let mut found = std::mem::take(&mut self.scratch.found);
        found.clear();
        let mut grantable = true;
        let mut new_holds = 0;
        for name in &a.names {
            let id = self.names.get(name.as_str()).copied();
            found.push(id);
            let Some(id) = id else {
                new_holds += 1;
                continue;
            };
            let lock = self.lock(id);
            if let Some(index) = lock.hold_of(a.session, &a.owner) {
                let held = lock.holders[index].mode;
                if !a.reentrant {
                    return Err(EngineError::AlreadyHeld { name: name.clone() });
                }
                if held != a.mode {
                    return Err(EngineError::ModeMismatch {
                        name: name.clone(),
                        held,
                        requested: a.mode,
                    });
                }
                continue;
            }
            new_holds += 1;
            if let Mode::Semaphore { permits } = a.mode {
                let existing = lock
                    .holders
                    .iter()
                    .map(|h| h.mode)
                    .chain(self.live_queue(lock).map(|k| self.waiters[k].mode))
                    .find_map(|m| match m {
                        Mode::Semaphore { permits: p } if p != permits => Some(p),
                        _ => None,
                    });
                if let Some(existing) = existing {
                    return Err(EngineError::PermitMismatch {
                        name: name.clone(),
                        existing,
                        requested: permits,
                    });
                }
            }
            let queue_clear = self
                .live_queue(lock)
                .all(|k| !self.waiters[k].mode.conflicts_in_queue(a.mode));
            grantable &= queue_clear && !lock.delayed(now) && lock.holders_admit(a.mode);
        }
        if a.session != SessionId::NONE {
            self.check_holds_limit(a.session, new_holds)?;
        }

        if !grantable {
            match a.wait {
                Wait::No => {
                    effects.push(Effect::WouldBlock {
                        session: a.session,
                        request: a.request,
                    });
                    return Ok(());
                }
                Wait::Until(deadline) if deadline <= now => {
                    effects.push(Effect::TimedOut {
                        session: a.session,
                        request: a.request,
                    });
                    return Ok(());
                }
                _ => {}
            }
            for name in &a.names {
                if let Some(&id) = self.names.get(name.as_str()) {
                    if self.lock(id).queue.len() >= self.limits.max_waiters_per_lock {
                        return Err(EngineError::LimitReached {
                            what: "waiters per lock",
                            limit: self.limits.max_waiters_per_lock as u64,
                        });
                    }
                }
            }
        }

        // The reusable buffer when granted at once, the waiter's own list when
        // queued: the uncontended path builds no `Waiter` and clones no owner.
        let mut locks = if grantable {
            std::mem::take(&mut self.scratch.locks)
        } else {
            Vec::with_capacity(a.names.len())
        };
        for (name, id) in a.names.into_iter().zip(found.drain(..)) {
            locks.push(match id {
                Some(id) => id,
                None => self.insert_lock(name),
            });
        }
        self.scratch.found = found;
        if grantable {
            let tokens = self.grant(
                now,
                Grant {
                    session: key.0,
                    locks: &locks,
                    owner: a.owner.into_boxed_str(),
                    mode: a.mode,
                    lease: a.lease,
                    lock_delay: a.lock_delay,
                },
            );
            locks.clear();
            self.scratch.locks = locks;
            effects.push(Effect::Granted {
                session: key.0,
                request: key.1,
                tokens,
            });
            return Ok(());
        }
        let waiter = Waiter {
            locks,
            owner: a.owner.into_boxed_str(),
            mode: a.mode,
            reentrant: a.reentrant,
            lease: a.lease,
            lock_delay: a.lock_delay,
            since: now,
            deadline: match a.wait {
                Wait::Until(deadline) => Some(deadline),
                _ => None,
            },
        };
        let first = self.lock(waiter.locks[0]);
        let position = match self.ending.is_empty() {
            true => first.queue.len(),
            false => self.live_queue(first).count(),
        } as u32;
        for &id in &waiter.locks {
            self.lock_mut(id).queue.push_back(key);
        }
        if let Some(deadline) = waiter.deadline {
            self.timers.insert((deadline, Timer::Waiter(key.0, key.1)));
        }
        if let Some(session) = self.sessions.get_mut(&key.0) {
            session.add_waiter(key.1, waiter.locks.len());
        }
        self.waiters.insert(key, waiter);
        effects.push(Effect::Queued {
            session: key.0,
            request: key.1,
            position,
        });
        Ok(())
    }

    fn validate_acquire(&self, a: &Acquire) -> Result<(), EngineError> {
        if a.names.is_empty() {
            return Err(EngineError::NoNames);
        }
        if a.names.len() > self.limits.max_names_per_acquire {
            return Err(EngineError::LimitReached {
                what: "names per acquire",
                limit: self.limits.max_names_per_acquire as u64,
            });
        }
        for (i, name) in a.names.iter().enumerate() {
            validate_name(name).map_err(|error| EngineError::InvalidName {
                name: name.chars().take(64).collect(),
                error,
            })?;
            if a.names[..i].contains(name) {
                return Err(EngineError::DuplicateName { name: name.clone() });
            }
        }
        if a.mode == (Mode::Semaphore { permits: 0 }) {
            return Err(EngineError::ZeroPermits);
        }
        if let Some(lease) = a.lease {
            self.check_range("lease", lease, self.limits.min_ttl, self.limits.max_ttl)?;
        }
        self.check_range("lock-delay", a.lock_delay, 0, self.limits.max_lock_delay)?;
        if a.session == SessionId::NONE {
            if a.lease.is_none() {
                return Err(EngineError::LeaseRequired);
            }
        } else {
            let session = self
                .sessions
                .get(&a.session)
                .ok_or(EngineError::UnknownSession(a.session.0))?;
            if session.waiting.contains(&a.request) {
                return Err(EngineError::DuplicateRequest(a.request.0));
            }
        }
        if a.session == SessionId::NONE && self.waiters.contains_key(&(a.session, a.request)) {
            return Err(EngineError::DuplicateRequest(a.request.0));
        }
        Ok(())
    }

    /// Creates or re-enters a hold on every lock of the request; returns the
    /// tokens.
    fn grant(&mut self, now: Millis, grant: Grant<'_>) -> Vec<u64> {
        let Grant {
            session,
            locks,
            owner,
            mode,
            lease,
            lock_delay,
        } = grant;
        let mut tokens = Vec::with_capacity(locks.len());
        // The owner string moves into the last new hold; earlier ones clone it.
        let mut owner = Some(owner);
        for (i, &id) in locks.iter().enumerate() {
            let lock = Arc::make_mut(self.locks.slot_mut(id).as_mut().expect("live lock"));
            let who: &str = owner.as_deref().expect("taken only at the last lock");
            if let Some(index) = lock.hold_of(session, who) {
                let hold = &mut lock.holders[index];
                hold.count += 1;
                tokens.push(hold.token);
                continue;
            }
            let owner = if i + 1 == locks.len() {
                owner.take().expect("present")
            } else {
                who.into()
            };
            self.last_token += 1;
            let token = self.last_token;
            let lease_until = lease.map(|lease| now + lease);
            lock.holders.push(Hold {
                session,
                owner,
                mode,
                token,
                count: 1,
                lock_time: now,
                lease_until,
                lock_delay: compact_delay(lock_delay),
            });
            if let Some(until) = lease_until {
                self.timers.insert((until, Timer::Lease(id, token)));
            }
            if let Some(s) = self.sessions.get_mut(&session) {
                s.holds.insert(id);
            }
            tokens.push(token);
        }
        tokens
    }

    // ----- release, renew, expiry -----

    fn find_hold(
        &self,
        session: SessionId,
        owner: &str,
        name: &str,
        token: Option<u64>,
    ) -> Result<(LockId, usize), EngineError> {
        let not_held = || EngineError::NotHeld {
            name: name.to_owned(),
        };
        let &id = self.names.get(name).ok_or_else(not_held)?;
        let lock = self.lock(id);
        if lock.holders.is_empty() {
            return Err(not_held());
        }
        match lock.hold_of(session, owner) {
            Some(index) if token.is_none_or(|t| t == lock.holders[index].token) => Ok((id, index)),
            _ => Err(EngineError::NotOwner {
                name: name.to_owned(),
            }),
        }
    }

    fn release(
        &mut self,
        now: Millis,
        session: SessionId,
        owner: &str,
        name: &str,
        token: Option<u64>,
        effects: &mut Vec<Effect>,
    ) -> Result<(), EngineError> {
        let (id, index) = self.find_hold(session, owner, name, token)?;
        let hold = &mut self.lock_mut(id).holders[index];
        hold.count -= 1;
        if hold.count == 0 {
            self.drop_hold(now, id, index, None, false, effects);
            if self.lock(id).queue.is_empty() {
                // Nobody waits: nothing to grant, at most an idle entry to drop.
                self.drop_if_idle(id);
            } else {
                self.settle(now, &[id], effects);
            }
        }
        Ok(())
    }

    fn renew(
        &mut self,
        now: Millis,
        session: SessionId,
        owner: &str,
        name: &str,
        token: Option<u64>,
        lease: Millis,
    ) -> Result<(), EngineError> {
        self.check_range("lease", lease, self.limits.min_ttl, self.limits.max_ttl)?;
        let (id, index) = self.find_hold(session, owner, name, token)?;
        let hold = &mut self.lock_mut(id).holders[index];
        let old = hold.lease_until.replace(now + lease);
        let token = hold.token;
        if let Some(old) = old {
            self.timers.remove(&(old, Timer::Lease(id, token)));
        }
        self.timers.insert((now + lease, Timer::Lease(id, token)));
        Ok(())
    }

    fn set_hold_count(
        &mut self,
        session: SessionId,
        owner: &str,
        name: &str,
        token: u64,
        count: u32,
    ) -> Result<(), EngineError> {
        if count == 0 {
            return Err(EngineError::ZeroHoldCount);
        }
        let (id, index) = self.find_hold(session, owner, name, Some(token))?;
        self.lock_mut(id).holders[index].count = count;
        Ok(())
    }

    fn expire_hold(
        &mut self,
        now: Millis,
        name: &str,
        token: u64,
        deadline: Millis,
        effects: &mut Vec<Effect>,
    ) -> Result<(), EngineError> {
        // A hold that is gone (released, or expired with its session) has no
        // deadline left to match.
        let &id = self.names.get(name).ok_or(EngineError::NotDue)?;
        let index = self
            .lock(id)
            .holders
            .iter()
            .position(|h| h.token == token)
            .ok_or(EngineError::NotDue)?;
        let current = self.lock(id).holders[index]
            .lease_until
            .ok_or(EngineError::NotDue)?;
        check_deadline(current, deadline, now)?;
        self.drop_hold(
            now,
            id,
            index,
            Some(LostReason::LeaseExpired),
            true,
            effects,
        );
        self.settle(now, &[id], effects);
        Ok(())
    }

    fn force_release(
        &mut self,
        now: Millis,
        name: &str,
        effects: &mut Vec<Effect>,
    ) -> Result<(), EngineError> {
        let not_held = || EngineError::NotHeld {
            name: name.to_owned(),
        };
        let &id = self.names.get(name).ok_or_else(not_held)?;
        if self.lock(id).holders.is_empty() {
            return Err(not_held());
        }
        while !self.lock(id).holders.is_empty() {
            self.drop_hold(now, id, 0, Some(LostReason::ForceReleased), false, effects);
        }
        self.settle(now, &[id], effects);
        Ok(())
    }

    /// Removes one hold entirely. `lost` reports it to its owner; `abnormal`
    /// starts the hold's lock-delay.
    fn drop_hold(
        &mut self,
        now: Millis,
        id: LockId,
        index: usize,
        lost: Option<LostReason>,
        abnormal: bool,
        effects: &mut Vec<Effect>,
    ) {
        let lock = Arc::make_mut(self.locks.slot_mut(id).as_mut().expect("live lock"));
        let hold = lock.holders.remove(index);
        let session_still_holds = lock.holders.iter().any(|h| h.session == hold.session);
        if let Some(until) = hold.lease_until {
            self.timers.remove(&(until, Timer::Lease(id, hold.token)));
        }
        if abnormal && hold.lock_delay > 0 {
            let until = now + Millis::from(hold.lock_delay);
            if lock.delay_until.is_none_or(|old| old < until) {
                if let Some(old) = lock.delay_until.replace(until) {
                    self.timers.remove(&(old, Timer::LockDelay(id)));
                }
                self.timers.insert((until, Timer::LockDelay(id)));
            }
        }
        if !session_still_holds {
            if let Some(session) = self.sessions.get_mut(&hold.session) {
                session.holds.remove(&id);
            } else if let Some(ending) = self.ending.get_mut(&hold.session) {
                ending.holds.remove(&id);
            }
        }
        if let Some(reason) = lost {
            effects.push(Effect::Lost {
                session: hold.session,
                owner: hold.owner.into(),
                name: lock.name.to_string(),
                token: hold.token,
                reason,
            });
        }
    }

    // ----- queues -----

    /// Removes a pending waiter (cancel or timeout) and lets those behind it move.
    fn remove_waiter(
        &mut self,
        now: Millis,
        key: WaiterKey,
        effect: Option<Effect>,
        effects: &mut Vec<Effect>,
    ) -> Result<(), EngineError> {
        if !self.waiters.contains_key(&key) {
            return Err(EngineError::UnknownRequest(key.1 .0));
        }
        let waiter = self.take_waiter(key);
        if let Some(session) = self.sessions.get_mut(&key.0) {
            session.remove_waiter(key.1, waiter.locks.len());
        } else if let Some(ending) = self.ending.get_mut(&key.0) {
            ending.waiting.remove(&key.1);
        }
        effects.extend(effect);
        self.settle(now, &waiter.locks, effects);
        Ok(())
    }

    /// Unlinks a waiter from its queues and timer; the caller fixes the session.
    fn take_waiter(&mut self, key: WaiterKey) -> Waiter {
        let waiter = self.waiters.remove(&key).expect("waiter exists");
        for &id in &waiter.locks {
            let queue = &mut self.lock_mut(id).queue;
            if let Some(pos) = queue.iter().position(|k| *k == key) {
                queue.remove(pos);
            }
        }
        if let Some(deadline) = waiter.deadline {
            self.timers.remove(&(deadline, Timer::Waiter(key.0, key.1)));
        }
        waiter
    }

    /// Grants every waiter that can now be granted, on `work` and on every lock a
    /// grant touches, then drops lock entries that became idle.
    fn settle(&mut self, now: Millis, ids: &[LockId], effects: &mut Vec<Effect>) {
        // Borrow the reusable buffers (settle never nests).
        let mut work = std::mem::take(&mut self.scratch.work);
        let mut seen = std::mem::take(&mut self.scratch.seen);
        // Process in the order given: ids are not deterministic, work order is.
        work.extend(ids.iter().rev());
        while let Some(id) = work.pop() {
            if self.locks.get(id).is_none_or(Option::is_none) {
                continue;
            }
            seen.push(id);
            self.scan(now, id, &mut work, effects);
        }
        for id in seen.drain(..) {
            self.drop_if_idle(id);
        }
        self.scratch.work = work;
        self.scratch.seen = seen;
    }

    /// Removes the lock's entry if nothing holds, waits or delays on it.
    fn drop_if_idle(&mut self, id: LockId) {
        // Looked at first: a chunk shared with a frozen copy is copied
        // only to change it.
        let idle = self.locks.get(id).and_then(Option::as_deref);
        if idle.is_some_and(LockEntry::is_idle) {
            let lock = self.locks.slot_mut(id).take().expect("checked");
            self.names.remove(&lock.name);
            self.free_ids.push(id);
        }
    }

    /// Walks one lock's queue in order, granting each waiter that conflicts with no
    /// earlier waiter and fits the current holders (on all of its locks).
    fn scan(&mut self, now: Millis, id: LockId, work: &mut Vec<LockId>, effects: &mut Vec<Effect>) {
        let mut i = 0;
        let mut shared_waiting_ahead = false;
        loop {
            let lock = self.lock(id);
            let Some(&key) = lock.queue.get(i) else { break };
            if self.is_ending(key.0) {
                // Never granted, and in no one's way (see `live_queue`).
                i += 1;
                continue;
            }
            let waiter = &self.waiters[&key];
            if waiter.mode != Mode::Shared && shared_waiting_ahead {
                break;
            }
            let ready = waiter
                .locks
                .iter()
                .all(|&other| self.can_grant(now, other, key, waiter, other != id));
            if !ready {
                if waiter.mode != Mode::Shared {
                    break;
                }
                shared_waiting_ahead = true;
                i += 1;
                continue;
            }
            let waiter = self.take_waiter(key);
            if let Some(session) = self.sessions.get_mut(&key.0) {
                session.remove_waiter(key.1, waiter.locks.len());
            }
            let tokens = self.grant(
                now,
                Grant {
                    session: key.0,
                    locks: &waiter.locks,
                    owner: waiter.owner,
                    mode: waiter.mode,
                    lease: waiter.lease,
                    lock_delay: waiter.lock_delay,
                },
            );
            effects.push(Effect::Granted {
                session: key.0,
                request: key.1,
                tokens,
            });
            work.extend(waiter.locks.iter().copied().filter(|&other| other != id));
        }
    }

    fn can_grant(
        &self,
        now: Millis,
        id: LockId,
        key: WaiterKey,
        waiter: &Waiter,
        check_queue: bool,
    ) -> bool {
        let lock = self.lock(id);
        if let Some(index) = lock.hold_of(key.0, &waiter.owner) {
            // Fix: the owner came to hold this lock while the request waited
            // (through another of its requests). That makes the grant a
            // re-entry, which the acquire path only allows when requested and in
            // the same mode; before, a queued exclusive request could re-enter a
            // shared hold (and be "granted" next to other readers), and a
            // non-reentrant one was re-entered anyway. Otherwise it waits until
            // the owner's own hold is gone.
            return waiter.reentrant && lock.holders[index].mode == waiter.mode;
        }
        if lock.delayed(now) || !lock.holders_admit(waiter.mode) {
            return false;
        }
        !check_queue
            || self
                .live_queue(lock)
                .take_while(|k| **k != key)
                .all(|k| !self.waiters[k].mode.conflicts_in_queue(waiter.mode))
    }

    // ----- helpers -----

    fn check_range(
        &self,
        what: &'static str,
        value: Millis,
        min: Millis,
        max: Millis,
    ) -> Result<(), EngineError> {
        if (min..=max).contains(&value) {
            Ok(())
        } else {
            Err(EngineError::OutOfRange {
                what,
                value_ms: value,
                min_ms: min,
                max_ms: max,
            })
        }
    }

    /// Whether `session` has ended and is giving up its holds and waits.
    fn is_ending(&self, session: SessionId) -> bool {
        !self.ending.is_empty() && self.ending.contains_key(&session)
    }

    /// A lock's queue without the waiters of ended sessions: they are never
    /// granted, block no one and count for no one's position, since the
    /// next step of their session's end drops them.
    fn live_queue<'a>(&'a self, lock: &'a LockEntry) -> impl Iterator<Item = &'a WaiterKey> + 'a {
        lock.queue.iter().filter(|key| !self.is_ending(key.0))
    }

    fn lock(&self, id: LockId) -> &LockEntry {
        self.locks
            .get(id)
            .and_then(Option::as_deref)
            .expect("live lock")
    }

    fn lock_mut(&mut self, id: LockId) -> &mut LockEntry {
        Arc::make_mut(self.locks.slot_mut(id).as_mut().expect("live lock"))
    }

    fn lock_id_or_insert(&mut self, name: String) -> LockId {
        match self.names.get(name.as_str()) {
            Some(&id) => id,
            None => self.insert_lock(name),
        }
    }

    /// Adds an entry for a name that has none.
    fn insert_lock(&mut self, name: String) -> LockId {
        let (name, id) = self.add_lock_entry(name);
        self.names.insert(name, id);
        id
    }

    /// Adds an empty entry for `name` to the table, without indexing it by
    /// name (the caller does).
    fn add_lock_entry(&mut self, name: String) -> (Arc<str>, LockId) {
        let name: Arc<str> = name.into();
        let entry = Arc::new(LockEntry {
            name: name.clone(),
            holders: Holders::default(),
            queue: VecDeque::new(),
            delay_until: None,
        });
        let id = match self.free_ids.pop() {
            Some(id) => {
                *self.locks.slot_mut(id) = Some(entry);
                id
            }
            None => self.locks.push(entry),
        };
        (name, id)
    }

    // ----- inspection -----

    /// The lock's holders and waiters, or `None` when nobody holds or waits.
    pub fn describe(&self, name: &str) -> Option<LockInfo> {
        self.names.get(name).map(|&id| self.lock_info(id))
    }

    /// Every held or awaited lock whose name starts with `prefix`, sorted by name.
    pub fn list(&self, prefix: &str) -> Vec<LockInfo> {
        self.list_page(prefix, "", usize::MAX).locks
    }

    /// One page of [`Engine::list`]: the first `limit` locks, by name, whose
    /// names start with `prefix` and come after `after` (`""`: from the start).
    /// O(log n + limit): a caller that serves huge tables in pages keeps
    /// every page short.
    pub fn list_page(&self, prefix: &str, after: &str, limit: usize) -> ListPage {
        let start = if after < prefix {
            Bound::Included(prefix)
        } else {
            Bound::Excluded(after)
        };
        let mut matching = self
            .names
            .range::<str, _>((start, Bound::Unbounded))
            .take_while(|(name, _)| name.starts_with(prefix));
        let locks = matching
            .by_ref()
            .take(limit)
            .map(|(_, &id)| self.lock_info(id))
            .collect();
        let more = matching.next().is_some();
        ListPage { locks, more }
    }

    /// Every open session, sorted by id.
    pub fn sessions(&self) -> Vec<SessionInfo> {
        let mut list: Vec<SessionInfo> = self
            .sessions
            .iter()
            .map(|(&session, s)| SessionInfo {
                session,
                info: ClientInfo::clone(&s.info),
                ttl: s.ttl,
                expires_at: s.expires_at,
                holds: s.holds.len(),
            })
            .collect();
        list.sort_unstable_by_key(|s| s.session);
        list
    }

    /// Whether the session is open.
    pub fn has_session(&self, session: SessionId) -> bool {
        self.sessions.contains_key(&session)
    }

    /// When the session expires unless heartbeated, if it is open.
    pub fn session_expires_at(&self, session: SessionId) -> Option<Millis> {
        self.sessions.get(&session).map(|s| s.expires_at)
    }

    /// The session's time-to-live, if it is open.
    pub fn session_ttl(&self, session: SessionId) -> Option<Millis> {
        self.sessions.get(&session).map(|s| s.ttl)
    }

    /// From now on the caller decides when sessions expire:
    /// [`Engine::due`] and [`Engine::next_deadline`] leave sessions out, and
    /// the engine keeps no timer per session. For a caller that keeps
    /// sessions alive by heartbeats it does not apply here: a replicated
    /// server's leader answers them under its lease and logs none, so only
    /// it knows when each session was last heard. Each session's
    /// [`Engine::session_expires_at`] is still kept (moved by
    /// [`Command::Heartbeat`] and [`Command::GrantGrace`]) as the earliest
    /// it may expire, and a [`Command::ExpireSession`] still applies only if
    /// the deadline it names has passed and is not earlier than that.
    pub fn time_sessions_by_caller(&mut self) {
        self.sessions_timed_by_caller = true;
        self.timers
            .retain(|(_, timer)| !matches!(timer, Timer::Session(_)));
    }

    fn lock_info(&self, id: LockId) -> LockInfo {
        let lock = self.lock(id);
        LockInfo {
            name: lock.name.to_string(),
            holders: lock
                .holders
                .iter()
                .map(|h| HolderInfo {
                    session: h.session,
                    owner: h.owner.to_string(),
                    lock_by: match self.sessions.get(&h.session) {
                        Some(session) => ClientInfo::clone(&session.info),
                        None => self
                            .ending
                            .get(&h.session)
                            .map(|e| ClientInfo::clone(&e.info))
                            .unwrap_or_default(),
                    },
                    lock_time: h.lock_time,
                    fencing_token: h.token,
                    lease_until: h.lease_until,
                    mode: h.mode,
                    hold_count: h.count,
                })
                .collect(),
            waiters: self
                .live_queue(lock)
                .map(|key| {
                    let w = &self.waiters[key];
                    WaiterInfo {
                        session: key.0,
                        request: key.1,
                        owner: w.owner.to_string(),
                        mode: w.mode,
                        since: w.since,
                        deadline: w.deadline,
                    }
                })
                .collect(),
            lock_delay_until: lock.delay_until,
        }
    }
}

impl Engine {
    /// A plain-data image of the whole state.
    pub fn snapshot(&self) -> Snapshot {
        self.freeze().into_snapshot()
    }

    /// The state as of now, for a [`Snapshot`] built elsewhere
    /// ([`FrozenEngine::into_snapshot`], on another thread): waiters are
    /// copied; sessions too, but each shares its client info (a reference,
    /// not two strings: 2 ms for 100 000 sessions, not 14); locks are
    /// shared (a reference per chunk of entries, a chunk and an entry
    /// copied on write by the engine), so freezing a table of a million
    /// locks costs about a thousand references, not a copy of every name
    /// and owner.
    pub fn freeze(&self) -> FrozenEngine {
        let sessions: Vec<FrozenSession> = self
            .sessions
            .iter()
            .map(|(&session, s)| FrozenSession {
                session,
                ttl: s.ttl,
                info: Arc::clone(&s.info),
                expires_at: s.expires_at,
            })
            .collect();
        let locks = self.locks.share();
        let waiters: Vec<WaiterSnapshot> = self
            .waiters
            .iter()
            .map(|(&(session, request), w)| WaiterSnapshot {
                session,
                request,
                names: w
                    .locks
                    .iter()
                    .map(|&id| self.lock(id).name.to_string())
                    .collect(),
                owner: w.owner.to_string(),
                mode: w.mode,
                reentrant: w.reentrant,
                lease: w.lease,
                lock_delay: w.lock_delay,
                since: w.since,
                deadline: w.deadline,
            })
            .collect();
        let ending = self
            .ending
            .iter()
            .map(|(&session, e)| EndingSnapshot {
                session,
                reason: e.reason,
                since: e.since,
                info: ClientInfo::clone(&e.info),
            })
            .collect();
        FrozenEngine {
            last_token: self.last_token,
            sessions,
            locks,
            waiters,
            ending,
        }
    }

    /// Rebuilds an engine from a snapshot taken by [`Engine::snapshot`];
    /// refuses one whose parts contradict each other ([`Snapshot::check`]).
    pub fn restore(limits: Limits, snapshot: Snapshot) -> Result<Engine, SnapshotError> {
        snapshot.check()?;
        let mut engine = Engine::new(limits);
        engine.last_token = snapshot.last_token;
        // What each ending session still holds and waits for is rebuilt
        // from the table below, as for open sessions.
        engine.ending = snapshot
            .ending
            .iter()
            .map(|e| {
                let ending = Ending {
                    reason: e.reason,
                    since: e.since,
                    info: engine.client_infos.share(e.info.clone()),
                    holds: FxHashSet::default(),
                    waiting: FxHashSet::default(),
                };
                (e.session, ending)
            })
            .collect();
        for s in snapshot.sessions {
            engine
                .timers
                .insert((s.expires_at, Timer::Session(s.session)));
            engine.sessions.insert(
                s.session,
                Session {
                    ttl: s.ttl,
                    expires_at: s.expires_at,
                    info: engine.client_infos.share(s.info),
                    holds: FxHashSet::default(),
                    waiting: FxHashSet::default(),
                    queued_names: 0,
                },
            );
        }
        // The names are indexed in one go once every lock has its entry:
        // the snapshot lists them in ascending order, and distinct (checked
        // above), which `BTreeMap`'s `FromIterator` sees in one pass and
        // builds from without a search. Inserted one by one, a million names
        // took 20 string comparisons each, a quarter of a big member's start.
        let mut names = Vec::with_capacity(snapshot.locks.len());
        for lock in snapshot.locks {
            let (name, id) = engine.add_lock_entry(lock.name);
            names.push((name, id));
            for h in lock.holders {
                if let Some(until) = h.lease_until {
                    engine.timers.insert((until, Timer::Lease(id, h.token)));
                }
                if let Some(session) = engine.sessions.get_mut(&h.session) {
                    session.holds.insert(id);
                }
                if let Some(ending) = engine.ending.get_mut(&h.session) {
                    ending.holds.insert(id);
                }
                engine.lock_mut(id).holders.push(Hold {
                    session: h.session,
                    owner: h.owner.into(),
                    mode: h.mode,
                    token: h.token,
                    count: h.count,
                    lock_time: h.lock_time,
                    lease_until: h.lease_until,
                    lock_delay: compact_delay(h.lock_delay),
                });
            }
            if let Some(until) = lock.delay_until {
                engine.timers.insert((until, Timer::LockDelay(id)));
            }
            let entry = engine.lock_mut(id);
            entry.queue = lock.queue.into();
            entry.delay_until = lock.delay_until;
        }
        engine.names = names.into_iter().collect();
        for w in snapshot.waiters {
            let locks: Vec<LockId> = w
                .names
                .into_iter()
                .map(|name| engine.lock_id_or_insert(name))
                .collect();
            if let Some(deadline) = w.deadline {
                engine
                    .timers
                    .insert((deadline, Timer::Waiter(w.session, w.request)));
            }
            if let Some(session) = engine.sessions.get_mut(&w.session) {
                session.add_waiter(w.request, locks.len());
            }
            if let Some(ending) = engine.ending.get_mut(&w.session) {
                ending.waiting.insert(w.request);
            }
            engine.waiters.insert(
                (w.session, w.request),
                Waiter {
                    locks,
                    owner: w.owner.into(),
                    mode: w.mode,
                    reentrant: w.reentrant,
                    lease: w.lease,
                    lock_delay: w.lock_delay,
                    since: w.since,
                    deadline: w.deadline,
                },
            );
        }
        Ok(engine)
    }
}

/// An open session as [`Engine::freeze`] took it: a [`SessionSnapshot`]
/// whose client info is shared with the engine. Serialized, it is that
/// [`SessionSnapshot`] (`Arc` serializes as what it holds), field for field.
#[derive(Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename = "SessionSnapshot"))]
struct FrozenSession {
    session: SessionId,
    ttl: Millis,
    info: Arc<ClientInfo>,
    expires_at: Millis,
}

/// The engine's state at one point, taken by [`Engine::freeze`]: turned into
/// a [`Snapshot`] (sorting and copying, the slow part with a big table) away
/// from the thread that runs the engine. With the `serde` feature it also
/// serializes as that [`Snapshot`] would, without copying the table first.
#[derive(Debug)]
pub struct FrozenEngine {
    last_token: u64,
    sessions: Vec<FrozenSession>,
    locks: Slab,
    ending: Vec<EndingSnapshot>,
    waiters: Vec<WaiterSnapshot>,
}

impl FrozenEngine {
    /// The snapshot, in the deterministic order [`Snapshot`] promises.
    pub fn into_snapshot(self) -> Snapshot {
        let FrozenEngine {
            last_token,
            mut sessions,
            locks,
            mut waiters,
            ending,
        } = self;
        sessions.sort_unstable_by_key(|s| s.session);
        let mut locks: Vec<&LockEntry> = locks.entries().map(|lock| &**lock).collect();
        locks.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        let locks = locks
            .iter()
            .map(|lock| LockSnapshot {
                name: lock.name.to_string(),
                holders: lock
                    .holders
                    .iter()
                    .map(|h| HoldSnapshot {
                        session: h.session,
                        owner: h.owner.to_string(),
                        mode: h.mode,
                        token: h.token,
                        count: h.count,
                        lock_time: h.lock_time,
                        lease_until: h.lease_until,
                        lock_delay: h.lock_delay.into(),
                    })
                    .collect(),
                queue: lock.queue.iter().copied().collect(),
                delay_until: lock.delay_until,
            })
            .collect();
        waiters.sort_unstable_by_key(|w| (w.session, w.request));
        let sessions = sessions
            .into_iter()
            .map(|s| SessionSnapshot {
                session: s.session,
                ttl: s.ttl,
                info: Arc::unwrap_or_clone(s.info),
                expires_at: s.expires_at,
            })
            .collect();
        Snapshot {
            last_token,
            sessions,
            locks,
            waiters,
            ending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sessions of one client share one copy of its info; the infos no
    /// session keeps are forgotten as new ones come, so the set stays within
    /// about twice those in use.
    #[test]
    fn sessions_of_one_client_share_its_info_and_unused_infos_go() {
        let mut infos = ClientInfos::default();
        let info = |n: usize| ClientInfo {
            name: format!("client {n}"),
            host: "host".into(),
        };
        let first = infos.share(info(1));
        let second = infos.share(info(1));
        assert!(Arc::ptr_eq(&first, &second), "one copy");
        for n in 2..10_000 {
            drop(infos.share(info(n)));
        }
        assert!(infos.shared.len() <= 65, "{} kept", infos.shared.len());
        assert!(
            Arc::ptr_eq(&first, &infos.share(info(1))),
            "the one in use stays"
        );
    }
}
