//! Lock handles: what to acquire and how, and the acquire calls themselves.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::time::Duration;

use locksmith_core::{validate_name, Mode};
use tokio::time::Instant;

use crate::arguments::{check_lease, check_owner};
use crate::backend::{AcquireRequest, Wait};
use crate::client::Client;
use crate::error::{Error, Result};
use crate::guard::Guard;
use crate::metrics::{self, Outcome};

/// Longest lock-delay (Chubby: at most a minute).
const MAX_LOCK_DELAY: Duration = Duration::from_secs(60);
/// Most names in one multi-lock.
const MAX_NAMES: usize = 64;

/// The locks a client makes.
impl Client {
    /// An exclusive lock.
    pub fn lock(&self, name: impl Into<String>) -> Lock {
        Lock::new(self.clone(), vec![name.into()], Mode::Exclusive)
    }

    /// A read-write lock.
    pub fn rw_lock(&self, name: impl Into<String>) -> RwLock {
        RwLock::new(self.clone(), name.into())
    }

    /// A semaphore of `permits` holders. Every user of the name must agree on
    /// `permits`; a mismatch is [`Error::Conflict`].
    pub fn semaphore(&self, name: impl Into<String>, permits: u32) -> Lock {
        Lock::new(self.clone(), vec![name.into()], Mode::Semaphore { permits })
    }

    /// Several exclusive locks taken all or nothing, without deadlock against
    /// other multi-locks in any order.
    pub fn multi_lock<I, S>(&self, names: I) -> Lock
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Lock::new(
            self.clone(),
            names.into_iter().map(Into::into).collect(),
            Mode::Exclusive,
        )
    }
}

/// Options of an acquire, set through the builder methods of [`Lock`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockOptions {
    /// Fixed lease; `None` keeps the hold alive while the client lives.
    pub lease: Option<Duration>,
    /// Default wait of [`Lock::acquire`]; `None` waits until granted.
    pub wait: Option<Duration>,
    /// Owner id; `None` gives every acquire its own owner.
    pub owner: Option<String>,
    /// Whether the same owner may acquire again (raising the hold count).
    pub reentrant: bool,
    /// After an abnormal loss, refuse new grants this long.
    pub lock_delay: Duration,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            lease: None,
            wait: None,
            owner: None,
            reentrant: true,
            lock_delay: Duration::ZERO,
        }
    }
}

/// A lock to acquire: one name or several, in one mode, with options.
///
/// Cheap to clone; acquiring does not consume it. Awaiting a `Lock` directly is
/// the same as [`Lock::acquire`].
#[derive(Clone, Debug)]
pub struct Lock {
    client: Client,
    names: Vec<String>,
    mode: Mode,
    options: LockOptions,
    /// An election's value (see [`AcquireRequest::published`]).
    published: Option<String>,
}

impl Lock {
    pub(crate) fn new(client: Client, names: Vec<String>, mode: Mode) -> Self {
        Lock {
            client,
            names,
            mode,
            options: LockOptions::default(),
            published: None,
        }
    }

    /// Makes the hold publish an election's `value` in the store's own
    /// election layout (elections only).
    pub(crate) fn publish(mut self, value: String) -> Self {
        self.published = Some(value);
        self
    }

    /// Gives the hold a fixed lease: it ends after `lease` unless extended, even
    /// while the client lives (no watchdog), like `SET NX PX`.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.options.lease = Some(lease);
        self
    }

    /// Makes [`Lock::acquire`] give up with [`Error::Timeout`] after `wait`.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.options.wait = Some(wait);
        self
    }

    /// Names the owner. Acquires with the same owner on the same client are
    /// re-entries (same token, hold count + 1) when re-entry is on.
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.options.owner = Some(owner.into());
        self
    }

    /// Turns re-entry on (default) or off; off makes a second acquire by the same
    /// owner fail with [`Error::AlreadyHeld`].
    pub fn reentrant(mut self, reentrant: bool) -> Self {
        self.options.reentrant = reentrant;
        self
    }

    /// After this hold is lost abnormally (expiry, not release), the lock grants
    /// nobody for `delay` (at most 60 s), so a paused former holder cannot race
    /// its successor.
    pub fn lock_delay(mut self, delay: Duration) -> Self {
        self.options.lock_delay = delay;
        self
    }

    /// The options as set so far.
    pub fn options(&self) -> &LockOptions {
        &self.options
    }

    /// The names this lock covers.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The mode it is acquired in.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Acquires, waiting as long as the [`Lock::wait`] option says (by default
    /// until granted), in FIFO order where the backend queues.
    ///
    /// Cancel safety: safe. Dropping the future leaves no queue entry and no
    /// hold behind.
    pub async fn acquire(&self) -> Result<Guard> {
        let wait = self.options.wait.map_or(Wait::Forever, Wait::For);
        self.acquire_with(wait)
            .await?
            .ok_or_else(|| unreachable_none(&self.names))
    }

    /// Acquires only if that is possible right now; `Ok(None)` when busy.
    ///
    /// Cancel safety: safe, as for [`Lock::acquire`].
    pub async fn try_acquire(&self) -> Result<Option<Guard>> {
        self.acquire_with(Wait::No).await
    }

    /// Acquires, giving up with [`Error::Timeout`] after `wait`.
    ///
    /// Cancel safety: safe, as for [`Lock::acquire`].
    pub async fn acquire_timeout(&self, wait: Duration) -> Result<Guard> {
        self.acquire_with(Wait::For(wait))
            .await?
            .ok_or_else(|| unreachable_none(&self.names))
    }

    /// Acquires through the model, bounding a timed wait with a timer, and
    /// counts the outcome in the client metrics.
    ///
    /// Cancel safety: safe, as the model's acquire: dropping it leaves no queue
    /// entry and no hold (and counts nothing); the guard is made after the
    /// last await.
    async fn acquire_with(&self, wait: Wait) -> Result<Option<Guard>> {
        let request = self.request(wait)?;
        let backend = self.client.backend();
        let span = tracing::debug_span!(
            "acquire", backend = backend.name(), names = ?request.names, mode = %request.mode
        );
        let started = Instant::now();
        let acquire = self.client.model().acquire(backend.as_ref(), &request);
        let acquire = tracing::Instrument::instrument(acquire, span);
        let grant = match wait {
            Wait::For(limit) => tokio::time::timeout(limit, acquire)
                .await
                .map_err(|_| Error::Timeout(limit))
                .and_then(|result| result),
            Wait::No | Wait::Forever => acquire.await,
        };
        let outcome = match &grant {
            Ok(Some(_)) => Outcome::Granted,
            Ok(None) => Outcome::Busy,
            Err(Error::Timeout(_)) => Outcome::Timeout,
            Err(_) => Outcome::Error,
        };
        let waited = wait != Wait::No;
        metrics::acquired(backend.name(), outcome, waited, started.elapsed());
        Ok(grant?.map(|grant| {
            Guard::new(
                backend.name(),
                request.names,
                request.lease.is_some(),
                grant,
            )
        }))
    }

    /// Validates everything before any I/O and resolves the owner.
    fn request(&self, wait: Wait) -> Result<AcquireRequest> {
        if self.names.is_empty() {
            return Err(Error::InvalidArgument(
                "a lock needs at least one name".into(),
            ));
        }
        if self.names.len() > MAX_NAMES {
            return Err(Error::InvalidArgument(format!(
                "a multi-lock takes at most {MAX_NAMES} names"
            )));
        }
        for (i, name) in self.names.iter().enumerate() {
            validate_name(name).map_err(|source| Error::invalid_name(name, source))?;
            if self.names[..i].contains(name) {
                return Err(Error::InvalidArgument(format!(
                    "lock {name:?} is named twice"
                )));
            }
        }
        if self.mode == (Mode::Semaphore { permits: 0 }) {
            return Err(Error::InvalidArgument(
                "a semaphore needs at least one permit".into(),
            ));
        }
        if let Some(lease) = self.options.lease {
            check_lease(lease)?;
        }
        if self.options.lock_delay > MAX_LOCK_DELAY {
            return Err(Error::InvalidArgument(format!(
                "lock-delay of {:?} exceeds the limit of {MAX_LOCK_DELAY:?}",
                self.options.lock_delay
            )));
        }
        if let Some(owner) = &self.options.owner {
            check_owner("owner", owner)?;
        }
        let owner = self
            .options
            .owner
            .clone()
            .unwrap_or_else(|| self.client.fresh_owner());
        Ok(AcquireRequest {
            names: self.names.clone(),
            mode: self.mode,
            owner,
            wait,
            lease: self.options.lease,
            reentrant: self.options.reentrant,
            lock_delay: self.options.lock_delay,
            published: self.published.clone(),
            fresh_owner: self.options.owner.is_none(),
        })
    }
}

impl IntoFuture for Lock {
    type Output = Result<Guard>;
    type IntoFuture = Pin<Box<dyn Future<Output = Result<Guard>> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move { self.acquire().await })
    }
}

fn unreachable_none(names: &[String]) -> Error {
    Error::backend(
        "client",
        format!("backend answered 'busy' to a waiting acquire of {names:?}"),
    )
}

/// A read-write lock: many readers or one writer. Where the store queues
/// waiters in order (`capabilities().fifo`) a reader that comes after a
/// waiting writer waits behind it, so writers are not starved; on Redis
/// outside `mode=fair` (and over Redlock) a reader is let in while readers
/// hold, as with Redisson's `RReadWriteLock`.
#[derive(Clone, Debug)]
pub struct RwLock {
    client: Client,
    name: String,
}

impl RwLock {
    pub(crate) fn new(client: Client, name: String) -> Self {
        RwLock { client, name }
    }

    /// The reader side (shared mode). Await it, or set options first.
    pub fn read(&self) -> Lock {
        Lock::new(self.client.clone(), vec![self.name.clone()], Mode::Shared)
    }

    /// The writer side (exclusive mode). Await it, or set options first.
    pub fn write(&self) -> Lock {
        Lock::new(
            self.client.clone(),
            vec![self.name.clone()],
            Mode::Exclusive,
        )
    }
}
