//! The lock API with blocking calls, for programs that do not run an async
//! runtime: [`Client`], [`Lock`], [`RwLock`], [`Guard`], [`Election`],
//! [`Leadership`], each the counterpart of the async type of the same name
//! (and [`Observe`], an iterator over [`crate::Election::observe`]), with the
//! same options, rules and errors ([`crate::Error`]). Where the async API returns a future,
//! this one blocks the calling thread until the future would have completed.
//!
//! ```
//! use std::time::Duration;
//! use locksmith::blocking::Client;
//!
//! # fn main() -> locksmith::Result<()> {
//! let client = Client::connect("memory://")?;
//! let lock = client.lock("reports/daily");
//!
//! let guard = lock.acquire()?;                          // blocks until granted
//! let token = guard.fencing_token();                    // hand it to the resource
//! assert!(lock.try_acquire()?.is_none());               // held: no wait, no guard
//! assert!(matches!(
//!     lock.acquire_timeout(Duration::from_millis(50)),  // gives up in time
//!     Err(locksmith::Error::Timeout(_))
//! ));
//! if guard.is_lost() {
//!     panic!("stop writing");                           // check between steps
//! }
//! guard.release()?;                                     // checked release
//!
//! let next = lock.acquire()?;
//! assert!(next.fencing_token() > token);
//! drop(next);                                           // released when drop returns
//! # Ok(()) }
//! ```
//!
//! # How it runs
//!
//! Each [`Client`] starts its own tokio runtime, with one worker thread, and
//! drives the async client on it: the worker keeps the client's background
//! work going (session heartbeats, watchdog renewals, lost signals) while
//! your threads do their own work between calls, and each blocking call runs
//! its future to completion on the calling thread. Several threads may use one
//! client (and share its locks and guards) at once. Every lock rule is the
//! async layer's; this module only waits for it.
//!
//! # Dropping releases, and closes
//!
//! Unlike the async [`crate::Guard`], whose drop releases in the background,
//! dropping a blocking [`Guard`] releases the hold **before `drop` returns**
//! (unchecked: use [`Guard::release`] to see errors). So once `drop(guard)`
//! returns, another client can take the lock at once.
//!
//! The client is closed, before `drop` returns, when its last handle is
//! dropped: the last clone of the [`Client`] and of every [`Lock`],
//! [`RwLock`], [`Election`] and [`Guard`] made from it (each needs the
//! client, so each keeps it open; a guard outliving the client that made it
//! stays held). [`Client::close`] closes it at once and reports errors.
//!
//! # Inside an async runtime
//!
//! A thread that drives asynchronous tasks must not block, so every call of
//! this module made there (inside `#[tokio::main]`, a `Runtime::block_on`, a
//! task, or under a `Runtime::enter` guard) panics with a message saying so:
//! use the async API there. Called from [`tokio::task::spawn_blocking`], it
//! works. A guard or client dropped on such a thread cannot wait: it is
//! released or closed on a helper thread instead, and the drop returns at once.
//!
//! The runtime of the first client that opens a `memory://` table also runs
//! that table's timers (lease and session expiry); keep that client alive
//! while others use the table.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use locksmith_core::Mode;

use crate::backend::{Backend, GrantRecord, LockInfo, LostSignal};
use crate::election::Leader;
use crate::error::{Error, Result};
use crate::lock::LockOptions;
use crate::options::ConnectOptions;

/// What a client and everything made from it share: the runtime and the
/// async client on it. Dropped with the last handle, it closes the client.
struct Shared {
    /// `Some` until dropped; taken apart in `drop` in a set order.
    runtime: Option<tokio::runtime::Runtime>,
    client: Option<crate::Client>,
}

impl Shared {
    fn runtime(&self) -> &tokio::runtime::Runtime {
        self.runtime.as_ref().expect("runtime until dropped")
    }

    fn client(&self) -> &crate::Client {
        self.client.as_ref().expect("client until dropped")
    }

    /// Runs `future` to completion on this client's runtime, blocking the
    /// calling thread. `call` names the public method for the panic message.
    #[track_caller]
    fn wait<F: Future>(&self, call: &str, future: F) -> F::Output {
        assert_may_block(call);
        self.runtime().block_on(future)
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let (Some(runtime), Some(client)) = (self.runtime.take(), self.client.take()) else {
            return;
        };
        let close = move || {
            if let Err(error) = runtime.block_on(client.close()) {
                tracing::debug!(%error, "closing a dropped blocking client failed");
            }
            // The async client's parts may hand cleanups to the current
            // runtime as they drop: make that this client's runtime.
            let entered = runtime.enter();
            drop(client);
            drop(entered);
            drop(runtime);
        };
        if driving_async_tasks() {
            tracing::warn!(
                "a locksmith::blocking::Client was dropped on a thread that runs async tasks: \
                 it is closed on a helper thread"
            );
            std::thread::spawn(close);
        } else {
            close();
        }
    }
}

/// A connection to one lock store, with blocking calls: the counterpart of
/// [`crate::Client`].
///
/// Cheap to clone (clones share the connection and its runtime). The client
/// closes when its last handle is dropped, before that drop returns; see the
/// [module docs](self#dropping-releases-and-closes).
#[derive(Clone)]
pub struct Client {
    shared: Arc<Shared>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("blocking::Client")
            .field("backend", &self.shared.client().backend().name())
            .finish()
    }
}

impl Client {
    /// Connects with default options; the URL scheme picks the backend, as
    /// for [`crate::Client::connect`].
    ///
    /// # Panics
    ///
    /// On a thread that runs async tasks (see the [module docs](self#inside-an-async-runtime)).
    #[track_caller]
    pub fn connect(url: &str) -> Result<Client> {
        Client::connect_with(url, ConnectOptions::default())
    }

    /// Connects with the given options, as [`crate::Client::connect_with`].
    ///
    /// # Panics
    ///
    /// On a thread that runs async tasks (see the [module docs](self#inside-an-async-runtime)).
    #[track_caller]
    pub fn connect_with(url: &str, options: ConnectOptions) -> Result<Client> {
        assert_may_block("Client::connect");
        // A multi-thread runtime with one worker, rather than a current-thread
        // runtime: background work (heartbeats, renewals, lost signals, a
        // memory table's timers) must go on while no caller is inside a call,
        // which a current-thread runtime only does on a thread of its own fed
        // through channels. With a worker, any number of caller threads can
        // `block_on` directly, each running its own call.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("locksmith-blocking")
            .enable_all()
            .build()
            .map_err(|error| {
                Error::backend(
                    "blocking",
                    format!("cannot start the runtime of a blocking client: {error}"),
                )
            })?;
        let client = runtime.block_on(crate::Client::connect_with(url, options))?;
        Ok(Client {
            shared: Arc::new(Shared {
                runtime: Some(runtime),
                client: Some(client),
            }),
        })
    }

    /// An exclusive lock, as [`crate::Client::lock`].
    pub fn lock(&self, name: impl Into<String>) -> Lock {
        self.wrap(self.shared.client().lock(name))
    }

    /// A read-write lock, as [`crate::Client::rw_lock`].
    pub fn rw_lock(&self, name: impl Into<String>) -> RwLock {
        RwLock {
            shared: self.shared.clone(),
            inner: self.shared.client().rw_lock(name),
        }
    }

    /// A semaphore of `permits` holders, as [`crate::Client::semaphore`].
    /// Every user of the name must agree on `permits`; a mismatch is
    /// [`Error::Conflict`].
    pub fn semaphore(&self, name: impl Into<String>, permits: u32) -> Lock {
        self.wrap(self.shared.client().semaphore(name, permits))
    }

    /// Several exclusive locks taken all or nothing, without deadlock against
    /// other multi-locks in any order, as [`crate::Client::multi_lock`].
    pub fn multi_lock<I, S>(&self, names: I) -> Lock
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.wrap(self.shared.client().multi_lock(names))
    }

    /// Leader election on a lock name, as [`crate::Client::election`].
    pub fn election(&self, name: impl Into<String>) -> Election {
        Election {
            shared: self.shared.clone(),
            inner: self.shared.client().election(name),
        }
    }

    /// Holders and waiters of one lock, as [`crate::Client::describe`].
    ///
    /// # Panics
    ///
    /// On a thread that runs async tasks (see the [module docs](self#inside-an-async-runtime)).
    #[track_caller]
    pub fn describe(&self, name: &str) -> Result<Option<LockInfo>> {
        self.shared
            .wait("Client::describe", self.shared.client().describe(name))
    }

    /// Every lock whose name starts with `prefix` (`""` for all), sorted by
    /// name, as [`crate::Client::list`].
    ///
    /// # Panics
    ///
    /// On a thread that runs async tasks (see the [module docs](self#inside-an-async-runtime)).
    #[track_caller]
    pub fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        self.shared
            .wait("Client::list", self.shared.client().list(prefix))
    }

    /// Recent grants of the locks under `prefix`, as
    /// [`crate::Client::history`]; only the locksmith server keeps them.
    ///
    /// # Panics
    ///
    /// On a thread that runs async tasks (see the [module docs](self#inside-an-async-runtime)).
    #[track_caller]
    pub fn history(&self, prefix: &str) -> Result<Vec<GrantRecord>> {
        self.shared
            .wait("Client::history", self.shared.client().history(prefix))
    }

    /// Administrator: frees a lock whoever holds it; holders see their guard
    /// lost. As [`crate::Client::force_release`].
    ///
    /// # Panics
    ///
    /// On a thread that runs async tasks (see the [module docs](self#inside-an-async-runtime)).
    #[track_caller]
    pub fn force_release(&self, name: &str) -> Result<()> {
        self.shared.wait(
            "Client::force_release",
            self.shared.client().force_release(name),
        )
    }

    /// Releases everything this client holds and stops its background work,
    /// reporting errors, as [`crate::Client::close`]. Dropping the last handle
    /// does the same without the report.
    ///
    /// # Panics
    ///
    /// On a thread that runs async tasks (see the [module docs](self#inside-an-async-runtime)).
    #[track_caller]
    pub fn close(&self) -> Result<()> {
        self.shared
            .wait("Client::close", self.shared.client().close())
    }

    /// The backend, for its name and capabilities.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        self.shared.client().backend()
    }

    fn wrap(&self, inner: crate::Lock) -> Lock {
        Lock {
            shared: self.shared.clone(),
            inner,
        }
    }
}

/// A lock to acquire, with blocking acquire calls: the counterpart of
/// [`crate::Lock`], with the same options.
///
/// Cheap to clone; acquiring does not consume it.
#[derive(Clone)]
pub struct Lock {
    shared: Arc<Shared>,
    inner: crate::Lock,
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("blocking::Lock")
            .field("names", &self.inner.names())
            .field("mode", &self.inner.mode())
            .field("options", self.inner.options())
            .finish()
    }
}

impl Lock {
    /// Gives the hold a fixed lease: it ends after `lease` unless extended,
    /// as [`crate::Lock::lease`].
    pub fn lease(self, lease: Duration) -> Self {
        self.map(|lock| lock.lease(lease))
    }

    /// Makes [`Lock::acquire`] give up with [`Error::Timeout`] after `wait`,
    /// as [`crate::Lock::wait`].
    pub fn wait(self, wait: Duration) -> Self {
        self.map(|lock| lock.wait(wait))
    }

    /// Names the owner, as [`crate::Lock::owner`]: acquires with the same
    /// owner on the same client are re-entries when re-entry is on.
    pub fn owner(self, owner: impl Into<String>) -> Self {
        self.map(|lock| lock.owner(owner))
    }

    /// Turns re-entry on (default) or off, as [`crate::Lock::reentrant`].
    pub fn reentrant(self, reentrant: bool) -> Self {
        self.map(|lock| lock.reentrant(reentrant))
    }

    /// After an abnormal loss, the lock grants nobody for `delay`, as
    /// [`crate::Lock::lock_delay`].
    pub fn lock_delay(self, delay: Duration) -> Self {
        self.map(|lock| lock.lock_delay(delay))
    }

    /// The options as set so far.
    pub fn options(&self) -> &LockOptions {
        self.inner.options()
    }

    /// The names this lock covers.
    pub fn names(&self) -> &[String] {
        self.inner.names()
    }

    /// The mode it is acquired in.
    pub fn mode(&self) -> Mode {
        self.inner.mode()
    }

    /// Acquires, blocking as long as the [`Lock::wait`] option says (by
    /// default until granted), as [`crate::Lock::acquire`].
    ///
    /// # Panics
    ///
    /// On a thread that runs async tasks (see the [module docs](self#inside-an-async-runtime)).
    #[track_caller]
    pub fn acquire(&self) -> Result<Guard> {
        let guard = self.shared.wait("Lock::acquire", self.inner.acquire())?;
        Ok(self.guard(guard))
    }

    /// Acquires only if that is possible right now; `Ok(None)` when busy. As
    /// [`crate::Lock::try_acquire`].
    ///
    /// # Panics
    ///
    /// On a thread that runs async tasks (see the [module docs](self#inside-an-async-runtime)).
    #[track_caller]
    pub fn try_acquire(&self) -> Result<Option<Guard>> {
        let guard = self
            .shared
            .wait("Lock::try_acquire", self.inner.try_acquire())?;
        Ok(guard.map(|guard| self.guard(guard)))
    }

    /// Acquires, giving up with [`Error::Timeout`] after `wait`, as
    /// [`crate::Lock::acquire_timeout`].
    ///
    /// # Panics
    ///
    /// On a thread that runs async tasks (see the [module docs](self#inside-an-async-runtime)).
    #[track_caller]
    pub fn acquire_timeout(&self, wait: Duration) -> Result<Guard> {
        let guard = self
            .shared
            .wait("Lock::acquire_timeout", self.inner.acquire_timeout(wait))?;
        Ok(self.guard(guard))
    }

    fn map(self, f: impl FnOnce(crate::Lock) -> crate::Lock) -> Self {
        Lock {
            shared: self.shared,
            inner: f(self.inner),
        }
    }

    fn guard(&self, inner: crate::Guard) -> Guard {
        Guard {
            shared: self.shared.clone(),
            inner: Some(inner),
        }
    }
}

/// A read-write lock, as [`crate::RwLock`]: many readers or one writer.
#[derive(Clone)]
pub struct RwLock {
    shared: Arc<Shared>,
    inner: crate::RwLock,
}

impl fmt::Debug for RwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("blocking::RwLock")
            .field("inner", &self.inner)
            .finish()
    }
}

impl RwLock {
    /// The reader side (shared mode); set options, then acquire.
    pub fn read(&self) -> Lock {
        Lock {
            shared: self.shared.clone(),
            inner: self.inner.read(),
        }
    }

    /// The writer side (exclusive mode); set options, then acquire.
    pub fn write(&self) -> Lock {
        Lock {
            shared: self.shared.clone(),
            inner: self.inner.write(),
        }
    }
}

/// A held lock (or several, for a multi-lock): the counterpart of
/// [`crate::Guard`].
///
/// Check [`Guard::fencing_token`] at every write to a fenced resource, check
/// [`Guard::is_lost`] (or wait with [`Guard::lost_timeout`]) to stop when the
/// hold can no longer be trusted, and end it with [`Guard::release`], the
/// checked path. **Dropping a guard releases the hold before `drop`
/// returns**, reporting nothing.
#[must_use = "dropping a guard releases the lock at once"]
pub struct Guard {
    shared: Arc<Shared>,
    /// `Some` until released.
    inner: Option<crate::Guard>,
}

impl Guard {
    fn inner(&self) -> &crate::Guard {
        self.inner.as_ref().expect("guard until released")
    }

    /// The fencing token of the (first) lock: strictly greater than that of
    /// every earlier holder. Pass it to the resource you protect.
    pub fn fencing_token(&self) -> u64 {
        self.inner().fencing_token()
    }

    /// Fencing tokens of every lock of a multi-lock, in the order they were named.
    pub fn fencing_tokens(&self) -> &[u64] {
        self.inner().fencing_tokens()
    }

    /// The (first) lock's name.
    pub fn name(&self) -> &str {
        self.inner().name()
    }

    /// Every name this guard holds.
    pub fn names(&self) -> &[String] {
        self.inner().names()
    }

    /// Re-entry depth of the (first) lock, as [`crate::Guard::hold_count`].
    pub fn hold_count(&self) -> u32 {
        self.inner().hold_count()
    }

    /// What is left of a leased hold's lease, as
    /// [`crate::Guard::remaining_lease`] (`None` without a lease).
    pub fn remaining_lease(&self) -> Option<Duration> {
        self.inner().remaining_lease()
    }

    /// Why the hold was lost, in a word, once it was (see
    /// [`crate::LostCause`]).
    pub fn lost_cause(&self) -> Option<crate::LostCause> {
        self.inner().lost_cause()
    }

    /// Whether the hold has been lost (session or lease expired, renewal
    /// failed, force-released, connection lost for too long). Cheap: check it
    /// between steps of the work the lock protects.
    pub fn is_lost(&self) -> bool {
        self.inner().is_lost()
    }

    /// Blocks until the hold is lost, and returns the reason: the counterpart
    /// of [`crate::Guard::lost`]. Useful on a watcher thread; elsewhere see
    /// [`Guard::lost_timeout`].
    ///
    /// # Panics
    ///
    /// On a thread that runs async tasks (see the [module docs](self#inside-an-async-runtime)).
    #[track_caller]
    pub fn lost(&self) -> String {
        self.shared.wait("Guard::lost", self.inner().lost())
    }

    /// Blocks until the hold is lost or `timeout` has passed: the reason if
    /// it was lost, `None` if it is still held.
    ///
    /// # Panics
    ///
    /// On a thread that runs async tasks (see the [module docs](self#inside-an-async-runtime)).
    #[track_caller]
    pub fn lost_timeout(&self, timeout: Duration) -> Option<String> {
        let lost = self.inner().lost();
        self.shared.wait("Guard::lost_timeout", async {
            tokio::time::timeout(timeout, lost).await.ok()
        })
    }

    /// The lost signal, to hand to other code ([`LostSignal::is_fired`],
    /// [`LostSignal::reason`], [`LostSignal::cause`]).
    pub fn lost_signal(&self) -> LostSignal {
        self.inner().lost_signal()
    }

    /// Extends a leased hold to `lease` from now, as [`crate::Guard::extend`].
    /// Holds without a lease live with the client and need no extension.
    ///
    /// # Panics
    ///
    /// On a thread that runs async tasks (see the [module docs](self#inside-an-async-runtime)).
    #[track_caller]
    pub fn extend(&self, lease: Duration) -> Result<()> {
        self.shared
            .wait("Guard::extend", self.inner().extend(lease))
    }

    /// Releases the hold and reports whether that worked, as
    /// [`crate::Guard::release`]: an error means the hold had already been
    /// lost or taken away.
    ///
    /// # Panics
    ///
    /// On a thread that runs async tasks (see the [module docs](self#inside-an-async-runtime)).
    #[track_caller]
    pub fn release(mut self) -> Result<()> {
        assert_may_block("Guard::release");
        let inner = self.inner.take().expect("guard until released");
        self.shared.runtime().block_on(inner.release())
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            release_on_drop(self.shared.clone(), "Guard", inner.release());
        }
    }
}

/// Runs the release of a dropped guard or leadership before `drop` returns;
/// on a thread that runs async tasks, which must not block, on a helper
/// thread instead.
fn release_on_drop(
    shared: Arc<Shared>,
    what: &'static str,
    release: impl Future<Output = Result<()>> + Send + 'static,
) {
    let release = move || {
        if let Err(error) = shared.runtime().block_on(release) {
            tracing::debug!(%error, "release of a dropped blocking {what} failed");
        }
    };
    if driving_async_tasks() {
        tracing::warn!(
            "a locksmith::blocking::{what} was dropped on a thread that runs async tasks: \
             it is released on a helper thread"
        );
        std::thread::spawn(release);
    } else {
        release();
    }
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            Some(inner) => f.debug_tuple("blocking::Guard").field(inner).finish(),
            None => f.write_str("blocking::Guard(released)"),
        }
    }
}

/// Leader election on one lock name, with blocking calls: the counterpart of
/// [`crate::Election`].
#[derive(Clone)]
pub struct Election {
    shared: Arc<Shared>,
    inner: crate::Election,
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("blocking::Election")
            .field("inner", &self.inner)
            .finish()
    }
}

impl Election {
    /// Blocks until this candidate leads, publishing `value`, as
    /// [`crate::Election::campaign`]. Leadership lasts until it is resigned,
    /// dropped (which resigns before `drop` returns) or lost: check
    /// [`Leadership::is_lost`] to step down in time.
    ///
    /// # Panics
    ///
    /// On a thread that runs async tasks (see the [module docs](self#inside-an-async-runtime)).
    #[track_caller]
    pub fn campaign(&self, value: impl Into<String>) -> Result<Leadership> {
        let inner = self
            .shared
            .wait("Election::campaign", self.inner.campaign(value))?;
        Ok(Leadership {
            shared: self.shared.clone(),
            inner: Some(inner),
        })
    }

    /// The leader now, then every change, as [`crate::Election::observe`]:
    /// each `next()` blocks until there is one.
    pub fn observe(&self) -> Observe {
        Observe {
            shared: self.shared.clone(),
            inner: Box::pin(self.inner.observe()),
        }
    }

    /// The current leader, if any, as [`crate::Election::leader`].
    ///
    /// # Panics
    ///
    /// On a thread that runs async tasks (see the [module docs](self#inside-an-async-runtime)).
    #[track_caller]
    pub fn leader(&self) -> Result<Option<Leader>> {
        self.shared.wait("Election::leader", self.inner.leader())
    }
}

/// The leader and its changes, one blocking `next()` at a time: the
/// counterpart of [`crate::Election::observe`]. It never ends by itself.
pub struct Observe {
    shared: Arc<Shared>,
    inner: futures::stream::BoxStream<'static, Result<Option<Leader>>>,
}

impl fmt::Debug for Observe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("blocking::Observe")
    }
}

impl Iterator for Observe {
    type Item = Result<Option<Leader>>;

    /// # Panics
    ///
    /// On a thread that runs async tasks (see the [module docs](self#inside-an-async-runtime)).
    #[track_caller]
    fn next(&mut self) -> Option<Self::Item> {
        use futures::StreamExt;
        self.shared.wait("Observe::next", self.inner.next())
    }
}

/// A won election, with blocking calls: the counterpart of
/// [`crate::Leadership`]. Dropping it resigns before `drop` returns.
#[must_use = "dropping a leadership resigns it at once"]
pub struct Leadership {
    shared: Arc<Shared>,
    /// `Some` until resigned.
    inner: Option<crate::Leadership>,
}

impl Leadership {
    fn inner(&self) -> &crate::Leadership {
        self.inner.as_ref().expect("leadership until resigned")
    }

    /// The value this leader publishes now.
    pub fn value(&self) -> &str {
        self.inner().value()
    }

    /// The fencing token of this term.
    pub fn fencing_token(&self) -> u64 {
        self.inner().fencing_token()
    }

    /// Whether leadership has been lost: check it between steps of the work.
    pub fn is_lost(&self) -> bool {
        self.inner().is_lost()
    }

    /// The lost signal, to hand to other code.
    pub fn lost_signal(&self) -> LostSignal {
        self.inner().guard().lost_signal()
    }

    /// Publishes a new value while leading, as [`crate::Leadership::proclaim`].
    ///
    /// # Panics
    ///
    /// On a thread that runs async tasks (see the [module docs](self#inside-an-async-runtime)).
    #[track_caller]
    pub fn proclaim(&mut self, value: impl Into<String>) -> Result<()> {
        let inner = self.inner.as_mut().expect("leadership until resigned");
        self.shared
            .wait("Leadership::proclaim", inner.proclaim(value))
    }

    /// Steps down, as [`crate::Leadership::resign`].
    ///
    /// # Panics
    ///
    /// On a thread that runs async tasks (see the [module docs](self#inside-an-async-runtime)).
    #[track_caller]
    pub fn resign(mut self) -> Result<()> {
        assert_may_block("Leadership::resign");
        let inner = self.inner.take().expect("leadership until resigned");
        self.shared.runtime().block_on(inner.resign())
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            release_on_drop(self.shared.clone(), "Leadership", inner.resign());
        }
    }
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("blocking::Leadership")
            .field(&self.inner)
            .finish()
    }
}

/// Panics, with a message that says what to do instead, when the calling
/// thread drives asynchronous tasks: blocking it would stall its runtime
/// (and tokio would panic less helpfully).
#[track_caller]
fn assert_may_block(call: &str) {
    if driving_async_tasks() {
        panic!(
            "locksmith::blocking::{call} was called from inside an async runtime, on a thread \
             that runs async tasks, which must not block. In async code use the async API \
             (locksmith::Client, and .await its calls), or run the blocking call in \
             tokio::task::spawn_blocking or on a thread of its own."
        );
    }
}

/// Whether the calling thread drives a tokio runtime's tasks (a worker, or
/// inside `Runtime::block_on`), where blocking is not allowed.
///
/// [`tokio::runtime::Handle::try_current`] alone says too much: it also
/// succeeds on `spawn_blocking` threads, made for blocking calls. Those run a
/// task outside the scheduler, which tokio shows in two public ways: the task
/// has an id ([`tokio::task::try_id`]), and a task yielding there is woken at
/// once, where a scheduler's thread defers the wake-up to its next turn.
fn driving_async_tasks() -> bool {
    if tokio::runtime::Handle::try_current().is_err() {
        return false;
    }
    if tokio::task::try_id().is_none() {
        // In a runtime's `block_on`, not in a task.
        return true;
    }
    struct Woken(AtomicBool);
    impl Wake for Woken {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let woken = Arc::new(Woken(AtomicBool::new(false)));
    let waker = Waker::from(woken.clone());
    let mut yield_now = std::pin::pin!(tokio::task::yield_now());
    match yield_now.as_mut().poll(&mut Context::from_waker(&waker)) {
        Poll::Ready(()) => false,
        Poll::Pending => !woken.0.load(Ordering::SeqCst),
    }
}
