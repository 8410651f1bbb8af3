//! The lock model between [`crate::Lock`] and a [`Backend`]: every rule that
//! is the same on every store is decided here, once, and backends only map
//! what is left onto their store.
//!
//! - **Refusals.** A request for what the store cannot do (lock-delay,
//!   semaphores, shared mode, per [`Capabilities`]) is
//!   [`Error::Unsupported`] before any I/O.
//! - **Multi-locks.** A store without atomic multi-locks gets the names one at
//!   a time, in sorted order (one global order, so two multi-locks never wait
//!   on each other in a cycle); a failure releases what was taken. So does a
//!   multi-lock of a named owner, whose names may be re-entries (each name
//!   is then decided by the re-entry table, as on every store); only an
//!   owner made for the acquire alone goes to the store atomically.
//! - **Re-entry**, decided here and nowhere else. This client's table of
//!   holds by (name, owner). An acquire of an owner that holds is a
//!   re-entry: same token, same lost signal, count + 1; only the last
//!   release ends the hold. A re-entry that is off is [`Error::AlreadyHeld`],
//!   one in another mode [`Error::Conflict`]. An acquire of an owner whose
//!   earlier acquire is still at the store joins it rather than queueing
//!   behind it: once that one is granted it re-enters, and should that one
//!   fail it asks the store itself. A joiner that may not re-enter (not
//!   reentrant, another mode) waits until the owner's hold is over. Every
//!   store sees one acquire and one release per hold, however deep the
//!   re-entry, and is told the depth ([`Hold::record_count`]) where its
//!   layout records one (the lock server's hold count, Redisson's hash
//!   field, etcd's value, the PostgreSQL rows), so that inspection shows
//!   what this table counts. The lock server's protocol keeps a re-entry of
//!   its own (a second acquire of the same owner) for callers that count
//!   nothing themselves; this library never relies on it.
//! - **One lost signal per hold**, shared by its re-entries, with the
//!   store's typed [`crate::LostCause`].
//! - **Fixed leases end here first.** A leased hold's lost signal fires
//!   when its lease runs out as this client measures it (from before the
//!   request that granted or extended it, less a store's clock drift), on
//!   every store: a store that ends a lease and grants the next waiter in
//!   one step tells the old holder only afterwards.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::{AcquireRequest, Backend, Capabilities, Grant, Hold, LostSignal, Mode, Wait};
use crate::error::{Error, Loss, Result};
use crate::keeper::{self, Kept, Term};
use crate::release::{give_back, release_in_background};

/// A grant as the lock API sees it.
pub(crate) struct Granted {
    /// Fencing token per requested name, in request order.
    pub tokens: Vec<u64>,
    /// The hold's lost signal.
    pub lost: LostSignal,
    /// One level of the hold.
    pub hold: Box<dyn Hold>,
    /// What the guard reports: the (first) lock's depth and lease.
    pub share: Arc<Share>,
}

/// One client's re-entry table.
#[derive(Default)]
pub(crate) struct Model {
    table: Mutex<HashMap<Key, Slot>>,
    /// Bumped whenever a slot changes, for acquires that wait on their
    /// owner's acquire or hold.
    changed: tokio::sync::watch::Sender<()>,
}

/// (lock name, owner).
type Key = (String, String);

enum Slot {
    /// An acquire of the owner is at the store.
    Pending,
    /// The owner holds the lock.
    Held(Arc<Share>),
}

/// One hold of one owner on one lock, shared by its levels of re-entry.
pub(crate) struct Share {
    key: Key,
    mode: Mode,
    token: u64,
    lost: LostSignal,
    /// Re-entry depth; changed under the table's lock.
    count: Mutex<u32>,
    /// When the lease runs out, as measured from before the request that
    /// granted or extended it (so never later than the store's own end).
    lease_until: Mutex<Option<Instant>>,
    /// A leased hold's keeper: the hold's lost signal fires when its lease
    /// runs out as this client measures it (less the clock drift a store
    /// may have), whatever the store says: a store may hand the lock on in
    /// the same step that ends the lease (the lock server and the memory
    /// store grant the next waiter as they tell the old holder), so hearing
    /// it from the store would come too late.
    lease_term: Option<LeaseKeeper>,
    /// The store's hold: every level shares it, the last release releases
    /// it. Async so that the operations on one hold reach the store in
    /// order.
    hold: tokio::sync::Mutex<Option<Box<dyn Hold>>>,
}

/// Keeps a leased hold's term until the hold is gone (see
/// [`Share::lease_term`]).
struct LeaseKeeper {
    term: tokio::sync::watch::Sender<Term>,
    done: CancellationToken,
}

impl LeaseKeeper {
    /// Starts keeping a lease of `lease` granted by a request sent at
    /// `sent`: when it runs out, `lost` fires.
    fn start(sent: Instant, lease: Duration, lost: LostSignal) -> LeaseKeeper {
        let term = tokio::sync::watch::Sender::new(
            Term::fixed("the hold's lease", Kept::Hold, sent, lease).with_clock_drift(),
        );
        let done = CancellationToken::new();
        let (kept, stopped) = (term.clone(), done.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = stopped.cancelled() => {}
                loss = keeper::keep_fixed(kept) => lost.fire_because(loss.cause, loss.reason),
            }
        });
        LeaseKeeper { term, done }
    }
}

impl Share {
    /// `started`: when the request that granted the hold was sent.
    fn new(key: Key, request: &AcquireRequest, grant: &Grant, started: Instant) -> Self {
        Share {
            key,
            mode: request.mode,
            token: grant.tokens[0],
            lost: grant.lost.clone(),
            count: Mutex::new(1),
            lease_until: Mutex::new(request.lease.map(|lease| started + lease)),
            lease_term: request
                .lease
                .map(|lease| LeaseKeeper::start(started, lease, grant.lost.clone())),
            hold: tokio::sync::Mutex::new(None),
        }
    }

    /// The lease was extended to `lease` by a request sent at `sent`.
    fn extended(&self, sent: Instant, lease: Duration) {
        *self.lease_until.lock().expect("lease lock") = Some(sent + lease);
        if let Some(keeper) = &self.lease_term {
            keeper.term.send_modify(|term| term.extended(sent, lease));
        }
    }

    /// Re-entry depth.
    pub fn count(&self) -> u32 {
        *self.count.lock().expect("count lock")
    }

    /// What is left of the lease, for a leased hold.
    pub fn remaining_lease(&self) -> Option<Duration> {
        let until = *self.lease_until.lock().expect("lease lock");
        until.map(|at| at.saturating_duration_since(Instant::now()))
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        if let Some(keeper) = &self.lease_term {
            keeper.done.cancel();
        }
    }
}

/// What the table says an acquire does next.
enum Step {
    /// Re-enter the owner's hold (its count already raised).
    Reenter(Arc<Share>),
    /// Ask the store; the slot stays pending until it answers.
    Lead(PendingSlot),
    /// Wait for the owner's acquire or hold to change, then look again.
    Wait(tokio::sync::watch::Receiver<()>),
    /// Busy, for a no-wait acquire.
    Busy,
}

impl Model {
    /// Acquires per `request` on `backend`, applying the model's rules.
    ///
    /// Cancel safety: safe; a dropped acquire leaves no slot, no level and
    /// (as backends promise) no hold behind.
    pub async fn acquire(
        self: &Arc<Self>,
        backend: &dyn Backend,
        request: &AcquireRequest,
    ) -> Result<Option<Granted>> {
        let capabilities = backend.capabilities();
        refuse_unsupported(backend.name(), &capabilities, request)?;
        if request.names.len() == 1 {
            return self.acquire_one(backend, request).await;
        }
        if capabilities.multi_lock && request.fresh_owner {
            // The store takes them atomically: the owner is this acquire's
            // own, so it holds none of them and nothing re-enters its hold.
            let started = Instant::now();
            return Ok(backend.acquire(request).await?.map(|grant| {
                let key = (request.names[0].clone(), request.owner.clone());
                let share = Share::new(key, request, &grant, started);
                let share = Arc::new(share);
                Granted {
                    tokens: grant.tokens,
                    lost: grant.lost,
                    hold: Box::new(Level {
                        model: self.clone(),
                        share: share.clone(),
                        own: Some(grant.hold),
                        tracked: false,
                    }),
                    share,
                }
            }));
        }
        self.acquire_each_in_order(backend, request).await
    }

    /// One name: the re-entry table's rules.
    ///
    /// Cancel safety: as [`Model::acquire`].
    async fn acquire_one(
        self: &Arc<Self>,
        backend: &dyn Backend,
        request: &AcquireRequest,
    ) -> Result<Option<Granted>> {
        let key = (request.names[0].clone(), request.owner.clone());
        let mut joined = false;
        loop {
            match self.step(&key, request, joined)? {
                Step::Busy => return Ok(None),
                Step::Wait(mut changed) => {
                    joined = true;
                    // The sender lives as long as the model.
                    let _ = changed.changed().await;
                }
                Step::Reenter(share) => {
                    let level = Unclaimed(Some(Level {
                        model: self.clone(),
                        share,
                        own: None,
                        tracked: true,
                    }));
                    return self.reenter(level).await;
                }
                Step::Lead(pending) => {
                    return self.lead(backend, request, pending).await;
                }
            }
        }
    }

    /// Decides under the table's lock what an acquire of `key` does next.
    fn step(self: &Arc<Self>, key: &Key, request: &AcquireRequest, joined: bool) -> Result<Step> {
        let mut table = self.table();
        match table.get(key) {
            Some(Slot::Held(share)) if share.lost.is_fired() => {
                // A lost hold is not re-entered; its levels still end it.
                table.remove(key);
            }
            Some(Slot::Held(share)) => {
                if request.reentrant && share.mode == request.mode {
                    *share.count.lock().expect("count lock") += 1;
                    return Ok(Step::Reenter(share.clone()));
                }
                if joined {
                    return Ok(Step::Wait(self.changed.subscribe()));
                }
                if !request.reentrant {
                    return Err(Error::AlreadyHeld {
                        name: key.0.clone(),
                    });
                }
                return Err(Error::Conflict {
                    name: key.0.clone(),
                    mode: request.mode,
                    detail: format!("the owner already holds it in mode {}", share.mode),
                });
            }
            Some(Slot::Pending) if request.wait == Wait::No => return Ok(Step::Busy),
            Some(Slot::Pending) => return Ok(Step::Wait(self.changed.subscribe())),
            None => {}
        }
        table.insert(key.clone(), Slot::Pending);
        Ok(Step::Lead(PendingSlot {
            model: self.clone(),
            key: Some(key.clone()),
        }))
    }

    /// Asks the store for a new hold and records it.
    ///
    /// Cancel safety: safe; the pending slot's drop clears it.
    async fn lead(
        self: &Arc<Self>,
        backend: &dyn Backend,
        request: &AcquireRequest,
        mut pending: PendingSlot,
    ) -> Result<Option<Granted>> {
        loop {
            let started = Instant::now();
            let Some(grant) = backend.acquire(request).await? else {
                return Ok(None);
            };
            // A leased grant that arrives after its lease's term (counted from
            // before the request, as its keeper counts it) may already be
            // the next holder's: its answer was held up, by a failover say.
            // It is given back, and the acquire asks again (within its wait)
            // once the store has taken it back: asked while it still stands,
            // the store would re-enter it, with the late lease's term.
            if let Some(lease) = request.lease {
                let term = keeper::trusted_until(started, lease, keeper::clock_drift(lease));
                if term <= Instant::now() {
                    tracing::debug!(lock = %request.names[0], ?lease, "a grant came after its lease ended: asking again");
                    give_back(grant.hold).await;
                    if request.wait == Wait::No {
                        return Ok(None);
                    }
                    continue;
                }
            }
            let key = pending.key.take().expect("pending until granted");
            return Ok(Some(self.record_new(key, request, started, grant)));
        }
    }

    /// Records a new hold in the table and hands out its first level.
    fn record_new(
        self: &Arc<Self>,
        key: Key,
        request: &AcquireRequest,
        started: Instant,
        grant: Grant,
    ) -> Granted {
        let share = Arc::new(Share::new(key.clone(), request, &grant, started));
        // No await between here and the guard: the level owns the hold.
        *share.hold.try_lock().expect("a new share is ours alone") = Some(grant.hold);
        self.table().insert(key, Slot::Held(share.clone()));
        self.slot_changed();
        Granted {
            tokens: grant.tokens,
            lost: grant.lost,
            hold: Box::new(Level {
                model: self.clone(),
                share: share.clone(),
                own: None,
                tracked: true,
            }),
            share,
        }
    }

    /// One more level of a hold: the store sees no acquire, only the new
    /// depth where its layout records one.
    ///
    /// Cancel safety: safe; a dropped re-entry gives its level back.
    async fn reenter(self: &Arc<Self>, mut level: Unclaimed) -> Result<Option<Granted>> {
        let share = level.share().clone();
        {
            let hold = share.hold.lock().await;
            if let Some(hold) = hold.as_ref() {
                hold.record_count(share.count()).await?;
            }
        }
        tracing::debug!(lock = %share.key.0, owner = %share.key.1, count = share.count(), "re-entered");
        Ok(Some(Granted {
            tokens: vec![share.token],
            lost: share.lost.clone(),
            hold: Box::new(level.claim()),
            share,
        }))
    }

    /// Takes the names one at a time in sorted order, each under the
    /// model's rules; a failure releases what was taken. The caller sees all
    /// or nothing.
    ///
    /// Cancel safety: safe; parts already taken are released in the
    /// background when the future is dropped.
    async fn acquire_each_in_order(
        self: &Arc<Self>,
        backend: &dyn Backend,
        request: &AcquireRequest,
    ) -> Result<Option<Granted>> {
        let mut order: Vec<usize> = (0..request.names.len()).collect();
        order.sort_by(|&a, &b| request.names[a].cmp(&request.names[b]));
        let mut taken = TakenSoFar::default();
        for index in order {
            let single = AcquireRequest {
                names: vec![request.names[index].clone()],
                ..request.clone()
            };
            match self.acquire_one(backend, &single).await {
                Ok(Some(part)) => taken.0.push((index, part)),
                Ok(None) => {
                    taken.release_all().await;
                    return Ok(None);
                }
                Err(error) => {
                    taken.release_all().await;
                    return Err(error);
                }
            }
        }
        let mut parts = std::mem::take(&mut taken.0);
        parts.sort_by_key(|(index, _)| *index);
        let lost = LostSignal::new();
        for (_, part) in &parts {
            let (part, all) = (part.lost.clone(), lost.clone());
            tokio::spawn(async move {
                let all_token = all.cancellation_token();
                tokio::select! {
                    reason = part.fired() => {
                        all.fire_because(part.cause().unwrap_or_default(), reason)
                    }
                    _ = all_token.cancelled() => {}
                }
            });
        }
        let tokens = parts.iter().map(|(_, part)| part.tokens[0]).collect();
        let share = parts[0].1.share.clone();
        let holds = parts.into_iter().map(|(_, part)| part.hold).collect();
        Ok(Some(Granted {
            tokens,
            lost,
            hold: Box::new(HoldAll(holds)),
            share,
        }))
    }

    fn table(&self) -> MutexGuard<'_, HashMap<Key, Slot>> {
        self.table.lock().expect("re-entry table lock")
    }

    /// Wakes the acquires waiting on their owner's acquire or hold, if any
    /// wait: called once a slot changed, with the table's lock let go. A
    /// waiting acquire subscribes under that lock (`step`), so one that
    /// subscribed before the change is counted here, and one that
    /// subscribes after it finds the change in the table. Nearly every
    /// change has nobody waiting, and telling a watch costs a lock and a
    /// round of its eight notifiers.
    fn slot_changed(&self) {
        if self.changed.receiver_count() > 0 {
            self.changed.send_replace(());
        }
    }
}

/// Refuses, before any I/O, what the store says it cannot do.
fn refuse_unsupported(
    backend: &'static str,
    capabilities: &Capabilities,
    request: &AcquireRequest,
) -> Result<()> {
    let missing = if !request.lock_delay.is_zero() && !capabilities.lock_delay {
        Some("lock-delay (nothing in this store holds a lock back after an abnormal loss)")
    } else if matches!(request.mode, Mode::Semaphore { .. }) && !capabilities.semaphore {
        Some("semaphores")
    } else if request.mode == Mode::Shared && !capabilities.shared {
        Some("shared (read-write) locks")
    } else {
        None
    };
    match missing {
        Some(what) => Err(Error::Unsupported {
            backend,
            what: what.into(),
        }),
        None => Ok(()),
    }
}

/// A pending slot; dropping it (the acquire failed or was dropped) clears
/// the slot and wakes the owner's joiners, who then ask the store themselves.
struct PendingSlot {
    model: Arc<Model>,
    key: Option<Key>,
}

impl Drop for PendingSlot {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            let mut table = self.model.table();
            if matches!(table.get(&key), Some(Slot::Pending)) {
                table.remove(&key);
            }
            drop(table);
            self.model.slot_changed();
        }
    }
}

/// One level of a hold, as a guard owns it.
struct Level {
    model: Arc<Model>,
    share: Arc<Share>,
    /// The hold of an atomic multi-lock, which has no share in the table
    /// (its owner is its acquire's own, so nothing re-enters it).
    own: Option<Box<dyn Hold>>,
    /// Whether the share is in the re-entry table (multi-locks taken
    /// atomically are not).
    tracked: bool,
}

impl Level {
    /// Gives up this level in the table; returns the depth left.
    fn leave(&self) -> u32 {
        let mut table = self.model.table();
        let left = {
            let mut count = self.share.count.lock().expect("count lock");
            *count = count.saturating_sub(1);
            *count
        };
        if left == 0 && self.tracked {
            if let Some(Slot::Held(share)) = table.get(&self.share.key) {
                if Arc::ptr_eq(share, &self.share) {
                    table.remove(&self.share.key);
                }
            }
        }
        drop(table);
        self.model.slot_changed();
        left
    }

    fn gone(&self) -> Error {
        match Loss::of(&self.share.lost) {
            Some(loss) => Error::Lost(loss),
            None => Error::NotHeld {
                name: self.share.key.0.clone(),
            },
        }
    }
}

#[async_trait]
impl Hold for Level {
    /// Releases one level; the last one releases the store's hold.
    ///
    /// Cancel safety: if dropped midway, the store's release may or may not
    /// have happened; the lease or session ends the hold in any case.
    async fn release(mut self: Box<Self>) -> Result<()> {
        let left = self.leave();
        if let Some(own) = self.own.take() {
            return own.release().await;
        }
        let mut hold = self.share.hold.lock().await;
        if left == 0 {
            return match hold.take() {
                Some(hold) => hold.release().await,
                None => Err(self.gone()),
            };
        }
        if let Some(loss) = Loss::of(&self.share.lost) {
            return Err(Error::Lost(loss));
        }
        match hold.as_ref() {
            Some(hold) => hold.record_count(self.share.count()).await,
            None => Err(self.gone()),
        }
    }

    /// Cancel safety: safe; the extension either happened or did not.
    async fn extend(&self, lease: Duration) -> Result<()> {
        let sent = Instant::now();
        match &self.own {
            Some(own) => own.extend(lease).await?,
            None => {
                let hold = self.share.hold.lock().await;
                hold.as_ref()
                    .ok_or_else(|| self.gone())?
                    .extend(lease)
                    .await?
            }
        }
        self.share.extended(sent, lease);
        Ok(())
    }

    /// Cancel safety: safe; the new value either landed or did not.
    async fn proclaim(&self, value: &str) -> Result<()> {
        match &self.own {
            Some(own) => own.proclaim(value).await,
            None => {
                let hold = self.share.hold.lock().await;
                hold.as_ref()
                    .ok_or_else(|| self.gone())?
                    .proclaim(value)
                    .await
            }
        }
    }
}

/// A level not yet handed to a guard; dropping it releases the level in the
/// background.
struct Unclaimed(Option<Level>);

impl Unclaimed {
    fn share(&self) -> &Arc<Share> {
        &self.0.as_ref().expect("unclaimed").share
    }

    fn claim(&mut self) -> Level {
        self.0.take().expect("claimed once")
    }
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        if let Some(level) = self.0.take() {
            release_in_background(Box::new(level));
        }
    }
}

/// Parts of a multi-lock taken so far.
#[derive(Default)]
struct TakenSoFar(Vec<(usize, Granted)>);

impl TakenSoFar {
    /// Releases every part taken so far, each on a task of its own, and
    /// waits for them: the caller's next try finds them free.
    ///
    /// Cancel safety: safe; the releases are spawned before the first
    /// await, so a dropped call leaves them running to the end (the parts
    /// go back all the same, only nobody waits for them).
    async fn release_all(&mut self) {
        let releases: Vec<_> = self
            .0
            .drain(..)
            .map(|(_, part)| tokio::spawn(async move { part.hold.release().await }))
            .collect();
        for release in releases {
            let _ = release.await;
        }
    }
}

impl Drop for TakenSoFar {
    fn drop(&mut self) {
        for (_, part) in self.0.drain(..) {
            release_in_background(part.hold);
        }
    }
}

/// Several holds that act as one.
struct HoldAll(Vec<Box<dyn Hold>>);

#[async_trait]
impl Hold for HoldAll {
    /// Releases the parts, each on a task of its own; the first error (in
    /// the order of the names) wins.
    ///
    /// Cancel safety: safe; the releases are spawned at the first poll, so
    /// a dropped call leaves them running to the end, unwaited: no part is
    /// left held (a part dropped unreleased could stay held, and renewed,
    /// as long as the client lives).
    async fn release(self: Box<Self>) -> Result<()> {
        let releases: Vec<_> = self
            .0
            .into_iter()
            .map(|hold| tokio::spawn(async move { hold.release().await }))
            .collect();
        let mut first_error = None;
        for release in releases {
            let result = match release.await {
                Ok(result) => result,
                Err(ended) if ended.is_panic() => std::panic::resume_unwind(ended.into_panic()),
                // Only a runtime that shuts down cancels the task.
                Err(_) => Err(Error::Closed),
            };
            if let Err(error) = result {
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Extends the parts one after another.
    ///
    /// Cancel safety: each part's extension either happened or did not; if
    /// dropped midway, the earlier parts are extended and the later ones not.
    async fn extend(&self, lease: Duration) -> Result<()> {
        for hold in &self.0 {
            hold.extend(lease).await?;
        }
        Ok(())
    }
}
