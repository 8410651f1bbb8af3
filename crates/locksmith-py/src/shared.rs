//! What the blocking and the asyncio API share: the base classes of their
//! clients, locks, guards, elections and leaderships (`locksmith._base`),
//! which hold the Rust objects and answer everything that neither blocks
//! nor awaits. Each API's classes extend these with the calls that wait
//! ([`crate::blocking`] blocks on them, [`crate::aio`] returns awaitables).

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::BoxStream;
use pyo3::prelude::*;

use crate::convert::{self, configure};
use crate::errors::{self, IntoPyResult};
use crate::held::{Held, Hold, Holding};
use crate::runtime;

/// The options of a connection, from `connect`'s keyword arguments.
pub fn connect_options(
    session_ttl: Option<&Bound<'_, PyAny>>,
    client_name: Option<String>,
    host: Option<String>,
) -> PyResult<locksmith::ConnectOptions> {
    let mut options = locksmith::ConnectOptions::default();
    if let Some(ttl) = convert::optional_duration(session_ttl, "session_ttl")? {
        options = options.session_ttl(ttl);
    }
    if let Some(name) = client_name {
        options = options.client_name(name);
    }
    if let Some(host) = host {
        options = options.host(host);
    }
    Ok(options)
}

/// A client made in this process (not in a forked parent).
pub struct Connection {
    generation: u64,
    /// `Some` until dropped.
    client: Option<locksmith::Client>,
}

impl Connection {
    pub fn new(client: locksmith::Client) -> Arc<Self> {
        Arc::new(Connection {
            generation: runtime::generation(),
            client: Some(client),
        })
    }

    /// The client, or `Closed` in a forked child.
    pub fn client(&self) -> PyResult<&locksmith::Client> {
        runtime::check_generation(self.generation)?;
        Ok(self.get())
    }

    fn get(&self) -> &locksmith::Client {
        self.client.as_ref().expect("client until dropped")
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // The client's parts hand their cleanups to the current runtime.
        let Some(client) = self.client.take() else {
            return;
        };
        if self.generation == runtime::generation() {
            let _entered = runtime::runtime().enter();
            drop(client);
        } else {
            std::mem::forget(client);
        }
    }
}

/// Which API a client, and everything it hands out, belongs to: how that
/// API's module makes its classes over the bases here. Each module gives
/// its own (`blocking::FLAVOR`, `aio::FLAVOR`), so that this module names
/// neither.
#[derive(Clone, Copy)]
pub struct Flavor {
    /// The API's `Lock` over `base`.
    pub make_lock: fn(Python<'_>, LockBase) -> PyResult<Py<PyAny>>,
    /// The API's `RwLock` over `base`.
    pub make_rw_lock: fn(Python<'_>, RwLockBase) -> PyResult<Py<PyAny>>,
    /// The API's `Election` over `base`.
    pub make_election: fn(Python<'_>, ElectionBase) -> PyResult<Py<PyAny>>,
}

impl Flavor {
    /// The API's `Lock` for `inner`.
    fn lock(
        self,
        py: Python<'_>,
        connection: &Arc<Connection>,
        inner: locksmith::Lock,
    ) -> PyResult<Py<PyAny>> {
        let base = LockBase {
            connection: connection.clone(),
            inner: Arc::new(inner),
        };
        (self.make_lock)(py, base)
    }

    fn rw_lock(
        self,
        py: Python<'_>,
        connection: &Arc<Connection>,
        inner: locksmith::RwLock,
    ) -> PyResult<Py<PyAny>> {
        let base = RwLockBase {
            flavor: self,
            connection: connection.clone(),
            inner,
        };
        (self.make_rw_lock)(py, base)
    }

    fn election(
        self,
        py: Python<'_>,
        connection: &Arc<Connection>,
        inner: locksmith::Election,
    ) -> PyResult<Py<PyAny>> {
        let base = ElectionBase {
            connection: connection.clone(),
            inner,
        };
        (self.make_election)(py, base)
    }
}

/// The [`Flavor`] of the module it is written in: that module's `Lock`,
/// `RwLock` and `Election` are its API's classes over the bases here.
macro_rules! this_flavor {
    () => {
        $crate::shared::Flavor {
            make_lock: |py, base| Ok(Py::new(py, Lock::new(base))?.into_any()),
            make_rw_lock: |py, base| {
                Ok(Py::new(py, PyClassInitializer::from(base).add_subclass(RwLock))?.into_any())
            },
            make_election: |py, base| {
                Ok(Py::new(py, PyClassInitializer::from(base).add_subclass(Election))?.into_any())
            },
        }
    };
}
pub(crate) use this_flavor;

/// The stream of leaders an election's `observe` reads, in either API.
pub type LeaderStream = BoxStream<'static, locksmith::Result<Option<locksmith::Leader>>>;

/// `repr` of `slf` as its class names itself: `<locksmith.aio.Lock ...>`.
fn repr_of(slf: &Bound<'_, PyAny>, details: std::fmt::Arguments<'_>) -> PyResult<String> {
    let class = slf.get_type();
    Ok(format!(
        "<{}.{} {details}>",
        class.module()?,
        class.qualname()?
    ))
}

/// A connection to one lock store.
#[pyclass(module = "locksmith._base", subclass, frozen)]
pub struct ClientBase {
    flavor: Flavor,
    pub connection: Arc<Connection>,
}

impl ClientBase {
    pub fn new(flavor: Flavor, client: locksmith::Client) -> Self {
        ClientBase {
            flavor,
            connection: Connection::new(client),
        }
    }

    fn configured(
        &self,
        py: Python<'_>,
        lock: locksmith::Lock,
        options: LockOptions<'_, '_>,
    ) -> PyResult<Py<PyAny>> {
        let lock = options.apply(lock)?;
        self.flavor.lock(py, &self.connection, lock)
    }
}

/// The keyword options every kind of lock takes.
pub struct LockOptions<'a, 'py> {
    wait: Option<&'a Bound<'py, PyAny>>,
    lease: Option<&'a Bound<'py, PyAny>>,
    owner: Option<String>,
    reentrant: bool,
    lock_delay: Option<&'a Bound<'py, PyAny>>,
}

impl LockOptions<'_, '_> {
    fn apply(self, lock: locksmith::Lock) -> PyResult<locksmith::Lock> {
        configure(
            lock,
            self.wait,
            self.lease,
            self.owner,
            self.reentrant,
            self.lock_delay,
        )
    }
}

#[pymethods]
impl ClientBase {
    /// An exclusive lock.
    #[pyo3(signature = (name, *, wait=None, lease=None, owner=None, reentrant=true, lock_delay=None))]
    #[allow(clippy::too_many_arguments)]
    fn lock(
        &self,
        py: Python<'_>,
        name: String,
        wait: Option<&Bound<'_, PyAny>>,
        lease: Option<&Bound<'_, PyAny>>,
        owner: Option<String>,
        reentrant: bool,
        lock_delay: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let lock = self.connection.client()?.lock(name);
        let options = LockOptions {
            wait,
            lease,
            owner,
            reentrant,
            lock_delay,
        };
        self.configured(py, lock, options)
    }

    /// A read-write lock: take its `read()` or `write()` side.
    fn rw_lock(&self, py: Python<'_>, name: String) -> PyResult<Py<PyAny>> {
        let inner = self.connection.client()?.rw_lock(name);
        self.flavor.rw_lock(py, &self.connection, inner)
    }

    /// A semaphore: up to `permits` holders at once.
    #[pyo3(signature = (name, permits, *, wait=None, lease=None, owner=None, reentrant=true, lock_delay=None))]
    #[allow(clippy::too_many_arguments)]
    fn semaphore(
        &self,
        py: Python<'_>,
        name: String,
        permits: u32,
        wait: Option<&Bound<'_, PyAny>>,
        lease: Option<&Bound<'_, PyAny>>,
        owner: Option<String>,
        reentrant: bool,
        lock_delay: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let lock = self.connection.client()?.semaphore(name, permits);
        let options = LockOptions {
            wait,
            lease,
            owner,
            reentrant,
            lock_delay,
        };
        self.configured(py, lock, options)
    }

    /// Several exclusive locks taken all or nothing.
    #[pyo3(signature = (names, *, wait=None, lease=None, owner=None, reentrant=true, lock_delay=None))]
    #[allow(clippy::too_many_arguments)]
    fn multi_lock(
        &self,
        py: Python<'_>,
        names: Vec<String>,
        wait: Option<&Bound<'_, PyAny>>,
        lease: Option<&Bound<'_, PyAny>>,
        owner: Option<String>,
        reentrant: bool,
        lock_delay: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let lock = self.connection.client()?.multi_lock(names);
        let options = LockOptions {
            wait,
            lease,
            owner,
            reentrant,
            lock_delay,
        };
        self.configured(py, lock, options)
    }

    /// Leader election on a lock name.
    fn election(&self, py: Python<'_>, name: String) -> PyResult<Py<PyAny>> {
        let inner = self.connection.client()?.election(name);
        self.flavor.election(py, &self.connection, inner)
    }

    /// The backend's name: `memory`, `server`, `redis`, `zookeeper`, `etcd`, `postgres`.
    #[getter]
    fn backend(&self) -> &'static str {
        self.connection.get().backend().name()
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        let backend = slf.get().backend();
        repr_of(slf.as_any(), format_args!("backend={backend:?}"))
    }
}

/// A lock to acquire.
#[pyclass(module = "locksmith._base", subclass, frozen)]
pub struct LockBase {
    pub connection: Arc<Connection>,
    /// Shared with the calls running on it: an acquire takes a reference,
    /// not a copy of the names and options.
    pub inner: Arc<locksmith::Lock>,
}

impl LockBase {
    /// The lock, for a call on it; `Closed` once its client is closed.
    pub fn to_call(&self) -> PyResult<Arc<locksmith::Lock>> {
        self.connection.client()?;
        Ok(self.inner.clone())
    }

    /// Acquires as the lock's options and `wait` say (see [`acquire`]).
    pub fn acquiring(
        &self,
        wait: Option<Duration>,
    ) -> PyResult<impl Future<Output = PyResult<Arc<Held<locksmith::Guard>>>> + Send + 'static>
    {
        let lock = self.to_call()?;
        Ok(acquire(lock, wait))
    }

    /// Acquires only if that is possible right now (see [`try_acquire`]).
    pub fn trying(
        &self,
    ) -> PyResult<
        impl Future<Output = PyResult<Option<Arc<Held<locksmith::Guard>>>>> + Send + 'static,
    > {
        let lock = self.to_call()?;
        Ok(try_acquire(lock))
    }
}

/// Acquires `lock` as its options and `wait` say: `wait` (else the lock's
/// own) of zero tries once and raises `Timeout` when busy.
///
/// Cancel safety: safe, as [`locksmith::Lock::acquire`].
pub async fn acquire(
    lock: Arc<locksmith::Lock>,
    wait: Option<Duration>,
) -> PyResult<Arc<Held<locksmith::Guard>>> {
    let guard = match wait.or(lock.options().wait) {
        Some(wait) if wait.is_zero() => lock
            .try_acquire()
            .await
            .py()?
            .ok_or_else(|| errors::to_py(locksmith::Error::Timeout(Duration::ZERO)))?,
        Some(wait) => lock.acquire_timeout(wait).await.py()?,
        None => lock.acquire().await.py()?,
    };
    Ok(Held::of_lock(guard, &lock))
}

/// Acquires `lock` only if that is possible right now.
///
/// Cancel safety: safe, as [`locksmith::Lock::try_acquire`].
pub async fn try_acquire(
    lock: Arc<locksmith::Lock>,
) -> PyResult<Option<Arc<Held<locksmith::Guard>>>> {
    let guard = lock.try_acquire().await.py()?;
    Ok(guard.map(|guard| Held::of_lock(guard, &lock)))
}

#[pymethods]
impl LockBase {
    #[getter]
    fn names(&self) -> Vec<String> {
        self.inner.names().to_vec()
    }

    /// `"exclusive"`, `"shared"` or `"semaphore"`.
    #[getter]
    fn mode(&self) -> &'static str {
        convert::mode_parts(self.inner.mode()).0
    }

    #[getter]
    fn permits(&self) -> Option<u32> {
        convert::mode_parts(self.inner.mode()).1
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        let inner = &slf.get().inner;
        let mode = convert::mode_text(inner.mode());
        repr_of(slf.as_any(), format_args!("{:?} {mode}", inner.names()))
    }
}

/// A read-write lock: many readers or one writer; writers are not starved
/// where the store queues waiters in order (not on Redis outside
/// `mode=fair`, nor over Redlock).
#[pyclass(module = "locksmith._base", subclass, frozen)]
pub struct RwLockBase {
    flavor: Flavor,
    connection: Arc<Connection>,
    inner: locksmith::RwLock,
}

#[pymethods]
impl RwLockBase {
    /// The reader side (shared).
    #[pyo3(signature = (*, wait=None, lease=None, owner=None, reentrant=true, lock_delay=None))]
    fn read(
        &self,
        py: Python<'_>,
        wait: Option<&Bound<'_, PyAny>>,
        lease: Option<&Bound<'_, PyAny>>,
        owner: Option<String>,
        reentrant: bool,
        lock_delay: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let options = LockOptions {
            wait,
            lease,
            owner,
            reentrant,
            lock_delay,
        };
        let lock = options.apply(self.inner.read())?;
        self.flavor.lock(py, &self.connection, lock)
    }

    /// The writer side (exclusive).
    #[pyo3(signature = (*, wait=None, lease=None, owner=None, reentrant=true, lock_delay=None))]
    fn write(
        &self,
        py: Python<'_>,
        wait: Option<&Bound<'_, PyAny>>,
        lease: Option<&Bound<'_, PyAny>>,
        owner: Option<String>,
        reentrant: bool,
        lock_delay: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let options = LockOptions {
            wait,
            lease,
            owner,
            reentrant,
            lock_delay,
        };
        let lock = options.apply(self.inner.write())?;
        self.flavor.lock(py, &self.connection, lock)
    }
}

/// What guards and leaderships have alike: names, fencing tokens and
/// whether the hold was lost.
#[pyclass(module = "locksmith._base", subclass, frozen)]
pub struct HoldBase {
    hold: Arc<dyn Hold>,
}

impl HoldBase {
    fn new<T: Holding>(held: &Arc<Held<T>>) -> Self {
        HoldBase { hold: held.clone() }
    }

    /// `repr` of a guard or a leadership, as its class names itself, with
    /// `details` after its names and tokens.
    fn repr(slf: &Bound<'_, Self>, details: std::fmt::Arguments<'_>) -> PyResult<String> {
        let base = slf.get();
        let state = if base.hold.is_released() {
            " released"
        } else if base.hold.lost().is_fired() {
            " lost"
        } else {
            ""
        };
        match (base.hold.names(), base.hold.tokens()) {
            ([name], [token]) => repr_of(
                slf.as_any(),
                format_args!("{name:?} fencing_token={token}{details}{state}"),
            ),
            (names, tokens) => repr_of(
                slf.as_any(),
                format_args!("{names:?} fencing_tokens={tokens:?}{details}{state}"),
            ),
        }
    }
}

#[pymethods]
impl HoldBase {
    /// The fencing token of the (first) lock.
    #[getter]
    fn fencing_token(&self) -> u64 {
        self.hold.tokens()[0]
    }

    /// The name of the (first) lock.
    #[getter]
    fn name(&self) -> &str {
        &self.hold.names()[0]
    }

    #[getter]
    fn is_lost(&self) -> bool {
        self.hold.lost().is_fired()
    }

    /// Why the hold was lost (a `LostCause`), once it was.
    #[getter]
    fn lost_cause<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.hold
            .lost()
            .cause()
            .map(|cause| errors::lost_cause(py, cause))
            .transpose()
    }

    /// Why the hold was lost, in words, once it was.
    #[getter]
    fn lost_reason(&self) -> Option<String> {
        self.hold.lost().reason()
    }

    /// Raises `Lost` if the hold was lost.
    fn raise_if_lost(&self, py: Python<'_>) -> PyResult<()> {
        let lost = self.hold.lost();
        match lost.reason() {
            Some(reason) => Err(errors::lost(py, lost.cause(), &reason)),
            None => Ok(()),
        }
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        Self::repr(slf, format_args!(""))
    }
}

/// A held lock (or several, for a multi-lock).
#[pyclass(module = "locksmith._base", extends = HoldBase, subclass, frozen)]
pub struct GuardBase {
    pub held: Arc<Held<locksmith::Guard>>,
}

impl GuardBase {
    pub fn new(held: Arc<Held<locksmith::Guard>>) -> PyClassInitializer<Self> {
        PyClassInitializer::from(HoldBase::new(&held)).add_subclass(GuardBase { held })
    }
}

#[pymethods]
impl GuardBase {
    /// Fencing tokens of every lock of a multi-lock, in order.
    #[getter]
    fn fencing_tokens(slf: &Bound<'_, Self>) -> Vec<u64> {
        slf.as_super().get().hold.tokens().to_vec()
    }

    #[getter]
    fn names(slf: &Bound<'_, Self>) -> Vec<String> {
        slf.as_super().get().hold.names().to_vec()
    }

    /// Re-entry depth (0 once released).
    #[getter]
    fn hold_count(&self) -> u32 {
        self.held.read(|guard| guard.hold_count()).unwrap_or(0)
    }

    /// Seconds left of a leased hold's lease; `None` without a lease.
    #[getter]
    fn remaining_lease(&self) -> Option<f64> {
        self.held
            .read(|guard| guard.remaining_lease())
            .flatten()
            .map(|left| left.as_secs_f64())
    }
}

/// An election on one lock name.
#[pyclass(module = "locksmith._base", subclass, frozen)]
pub struct ElectionBase {
    pub connection: Arc<Connection>,
    pub inner: locksmith::Election,
}

impl ElectionBase {
    /// Campaigns until this candidate leads, publishing `value`, or
    /// `Timeout` after `wait`.
    pub fn campaigning(
        &self,
        value: String,
        wait: Option<Duration>,
    ) -> PyResult<impl Future<Output = PyResult<locksmith::Leadership>> + Send + 'static> {
        self.connection.client()?;
        let election = self.inner.clone();
        Ok(async move {
            let campaign = election.campaign(value);
            match wait {
                Some(wait) => runtime::within(wait, campaign)
                    .await
                    .ok_or_else(|| errors::to_py(locksmith::Error::Timeout(wait)))?
                    .py(),
                None => campaign.await.py(),
            }
        })
    }
}

#[pymethods]
impl ElectionBase {
    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        repr_of(slf.as_any(), format_args!("{:?}", slf.get().inner.name()))
    }
}

/// This candidate's leadership until resigned, dropped or lost.
#[pyclass(module = "locksmith._base", extends = HoldBase, subclass, frozen)]
pub struct LeadershipBase {
    pub held: Arc<Held<locksmith::Leadership>>,
    pub value: Arc<Mutex<String>>,
}

impl LeadershipBase {
    pub fn new(leadership: locksmith::Leadership) -> PyClassInitializer<Self> {
        let value = Arc::new(Mutex::new(leadership.value().to_owned()));
        let held = Held::new(leadership);
        PyClassInitializer::from(HoldBase::new(&held)).add_subclass(LeadershipBase { held, value })
    }
}

#[pymethods]
impl LeadershipBase {
    /// The value this leader publishes now.
    #[getter]
    fn value(&self) -> String {
        self.value.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        let value = slf.get().value();
        HoldBase::repr(slf.as_super(), format_args!(" value={value:?}"))
    }
}

/// Registers the base classes in the native module.
pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<ClientBase>()?;
    module.add_class::<LockBase>()?;
    module.add_class::<RwLockBase>()?;
    module.add_class::<HoldBase>()?;
    module.add_class::<GuardBase>()?;
    module.add_class::<ElectionBase>()?;
    module.add_class::<LeadershipBase>()?;
    Ok(())
}
