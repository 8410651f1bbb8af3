//! The contract between the lock API and a store.
//!
//! A backend maps the shared lock model onto one store. It receives requests
//! that are already validated (names checked, options in range, owner
//! resolved) and that the model layer already decided on: refusals from
//! [`Capabilities`], multi-locks taken one name at a time where the store has
//! no atomic ones, and re-entry (see the `model` module). It returns grants;
//! everything a user sees (guards, timeouts, elections) is built once, above
//! this trait, in the rest of the crate.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::error::{Error, Result};
pub use crate::lost_signal::LostSignal;
pub use locksmith_core::Mode;

/// How long an acquire may wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Grant now or return `Ok(None)`.
    No,
    /// Wait at most this long. The caller also enforces it with a timer, so a
    /// backend may treat it as [`Wait::Forever`]; a store that can carry the
    /// deadline itself (so an abandoned waiter is dropped server-side) should.
    For(Duration),
    /// Wait until granted.
    Forever,
}

/// A validated acquire request. The library builds it from a [`crate::Lock`];
/// a backend reads it (new fields may be added, so it cannot be built by a
/// struct literal outside this crate: start from [`AcquireRequest::new`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AcquireRequest {
    /// One lock, or several to take atomically (all or nothing).
    pub names: Vec<String>,
    /// How to hold each of them.
    pub mode: Mode,
    /// Who holds, within this client. Acquiring again with the same owner is a
    /// re-entry; by default every acquire gets a fresh owner.
    pub owner: String,
    /// How long to wait.
    pub wait: Wait,
    /// A fixed lease: the hold expires unless extended. `None`: the backend keeps
    /// the hold alive for as long as the client lives (session / watchdog).
    pub lease: Option<Duration>,
    /// Whether the same owner may acquire again.
    pub reentrant: bool,
    /// After an abnormal loss, refuse new grants this long (zero: release at once).
    pub lock_delay: Duration,
    /// An election's value, for stores with election recipes of their own:
    /// the hold publishes it where those recipes read a candidate's value
    /// (the etcd key's value, the ZooKeeper node's data) instead of
    /// locksmith's metadata. `None` for locks.
    pub published: Option<String>,
    /// The owner was made for this acquire alone (the caller named none), so
    /// no other acquire can re-enter its hold: the model layer lets a store
    /// take such a multi-lock atomically.
    pub(crate) fresh_owner: bool,
}

impl AcquireRequest {
    /// A request by `owner` for `names` in `mode` with the defaults of a
    /// [`crate::Lock`]: wait until granted, no fixed lease, re-entrant, no
    /// lock-delay, nothing published.
    pub fn new(names: Vec<String>, mode: Mode, owner: impl Into<String>) -> Self {
        AcquireRequest {
            names,
            mode,
            owner: owner.into(),
            wait: Wait::Forever,
            lease: None,
            reentrant: true,
            lock_delay: Duration::ZERO,
            published: None,
            fresh_owner: false,
        }
    }
}

/// What a backend can do beyond the common contract, so callers (and the
/// conformance suite) know what to expect.
///
/// A backend outside this crate starts from the default (nothing beyond the
/// contract) and turns on what it does; new capabilities can be added without
/// breaking it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Waiters are granted strictly in arrival order.
    pub fifo: bool,
    /// Lock-delay after abnormal loss is enforced.
    pub lock_delay: bool,
    /// Inspection lists waiters, not just holders.
    pub lists_waiters: bool,
    /// Shared (read-write) mode is supported.
    pub shared: bool,
    /// Semaphores are supported.
    pub semaphore: bool,
    /// An election's leader can change its published value while it leads
    /// ([`Hold::proclaim`]).
    pub proclaim: bool,
    /// Several names are taken atomically in one request (only for an
    /// owner made for that acquire, which nothing re-enters). Otherwise
    /// [`Backend::acquire`] only ever gets one name, and multi-locks are
    /// taken one name at a time in sorted order.
    pub multi_lock: bool,
}

/// Wake-ups from a store that can watch a lock: each item says the holders
/// of the lock may have changed since the last one.
pub type HolderChanges = futures::stream::BoxStream<'static, Result<()>>;

/// A successful acquire.
pub struct Grant {
    /// Fencing token per requested name, in request order.
    pub tokens: Vec<u64>,
    /// Fires when the hold can no longer be trusted.
    pub lost: LostSignal,
    /// The live hold, for release and extension.
    pub hold: Box<dyn Hold>,
}

/// A live hold inside a backend.
#[async_trait]
pub trait Hold: Send + Sync + 'static {
    /// Releases the hold (every name of it), checked: fails if it was lost or is
    /// no longer ours.
    ///
    /// Cancel safety: if dropped midway the release may or may not have
    /// happened; the lease or session ends the hold in any case.
    async fn release(self: Box<Self>) -> Result<()>;

    /// Extends a leased hold to `lease` from now.
    ///
    /// Cancel safety: safe; an extension either happened or did not.
    async fn extend(&self, lease: Duration) -> Result<()>;

    /// Records a new re-entry depth, as the model layer counts it, where the
    /// store's layout keeps one (for inspection); the default keeps none.
    /// The hold's release ends it whatever depth was recorded last.
    ///
    /// Cancel safety: safe; the depth either landed or did not.
    async fn record_count(&self, count: u32) -> Result<()> {
        let _ = count;
        Ok(())
    }

    /// Replaces the value an election's hold publishes, atomically and only
    /// while the hold is still this one. Called only on backends whose
    /// [`Capabilities::proclaim`] is set; the others keep this default.
    ///
    /// Cancel safety: safe; the new value either landed or did not.
    async fn proclaim(&self, value: &str) -> Result<()> {
        let _ = value;
        Err(Error::Unsupported {
            backend: "this",
            what: "changing an election's value".into(),
        })
    }
}

/// A lock store.
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// Short name for errors and traces ("memory", "redis", ...).
    fn name(&self) -> &'static str;

    /// What this backend supports.
    fn capabilities(&self) -> Capabilities;

    /// Acquires per `request`; `Ok(None)` only for [`Wait::No`] when busy.
    /// The request asks only for what [`Backend::capabilities`] offers, and
    /// for one name unless [`Capabilities::multi_lock`]; it is never a
    /// re-entry of this client's live hold (the model layer decides
    /// re-entry), so a hold of its owner that the store still has is a
    /// leftover of one this client gave up (lost, or released where the
    /// release never arrived).
    ///
    /// Cancel safety: must be cancel safe. Dropping the future leaves no queue
    /// entry and no hold behind (a grant that raced the drop is released).
    async fn acquire(&self, request: &AcquireRequest) -> Result<Option<Grant>>;

    /// Holders and waiters of one lock (`None` when nobody holds or waits).
    ///
    /// Cancel safety: safe, read-only.
    async fn describe(&self, name: &str) -> Result<Option<LockInfo>>;

    /// Every lock under a prefix that this backend can enumerate, sorted by name.
    ///
    /// Cancel safety: safe, read-only.
    async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>>;

    /// Recent grants of the locks under a prefix (`""` for all), by name,
    /// oldest first within a lock. Only a store that keeps a grant history
    /// has one (the locksmith server); the others answer
    /// [`Error::Unsupported`].
    ///
    /// Cancel safety: safe, read-only.
    async fn history(&self, prefix: &str) -> Result<Vec<GrantRecord>> {
        let _ = prefix;
        Err(Error::Unsupported {
            backend: self.name(),
            what: "a grant history (the locksmith server keeps one)".into(),
        })
    }

    /// Wake-ups whenever the holders of `name` (or the values they publish)
    /// may have changed, for [`crate::Election::observe`]. The stream is
    /// armed when returned, so a read made after this call misses no change.
    /// `None` (the default): the store cannot watch, and the election polls.
    ///
    /// Cancel safety: safe; a dropped call leaves no watch behind.
    async fn watch_holders(&self, name: &str) -> Result<Option<HolderChanges>> {
        let _ = name;
        Ok(None)
    }

    /// Administrator: drop every hold of a lock, whoever owns it.
    ///
    /// Cancel safety: the release may or may not have happened.
    async fn force_release(&self, name: &str) -> Result<()>;

    /// Ends the client: releases what it holds and stops background work.
    ///
    /// Cancel safety: if dropped midway, the remaining holds end with the
    /// session or lease.
    async fn close(&self) -> Result<()>;
}

/// A lock as seen by inspection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockInfo {
    /// The lock's name.
    pub name: String,
    /// Current holders.
    pub holders: Vec<Holder>,
    /// Waiters in queue order (empty where the store cannot list them).
    pub waiters: Vec<Waiter>,
}

/// One holder of a lock. Fields a store does not record are `None`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Owner id as given by the acquiring client.
    pub owner: String,
    /// Who the client is ("name@host", or what the store records).
    pub lock_by: Option<String>,
    /// When the hold was granted.
    pub lock_time: Option<SystemTime>,
    /// The hold's fencing token.
    pub fencing_token: Option<u64>,
    /// When the hold's lease or session runs out unless renewed.
    pub lease_expires: Option<SystemTime>,
    /// How it is held.
    pub mode: Mode,
    /// Re-entry depth.
    pub hold_count: u32,
}

/// One grant of a lock, from a store's grant history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantRecord {
    /// The lock.
    pub name: String,
    /// Owner id as given by the acquiring client.
    pub owner: String,
    /// Who the client was ("name@host").
    pub lock_by: Option<String>,
    /// The hold's fencing token.
    pub fencing_token: u64,
    /// How it was held.
    pub mode: Mode,
    /// When it was granted.
    pub granted_at: SystemTime,
    /// How long the acquire waited in the queue first.
    pub waited: Duration,
    /// Whether and how the hold ended.
    pub end: HoldEnd,
}

/// How a recorded hold ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HoldEnd {
    /// Still held, as far as the store knows.
    Held,
    /// Its owner released it.
    Released {
        /// When.
        at: SystemTime,
    },
    /// It ended without its owner releasing it.
    Lost {
        /// When.
        at: SystemTime,
        /// Why ("session expired", "lease expired", ...).
        reason: String,
    },
}

/// One waiter of a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiter {
    /// Owner id as given by the waiting client.
    pub owner: String,
    /// Requested mode.
    pub mode: Mode,
    /// When it started waiting.
    pub since: Option<SystemTime>,
}
