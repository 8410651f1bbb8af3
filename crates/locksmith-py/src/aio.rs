//! The asyncio API (`locksmith.aio`): the classes of [`crate::blocking`]
//! with awaitables where those block. Each awaitable runs its future on the
//! process runtime; cancelling the awaiting task drops the future, which
//! leaves nothing behind (every call of the client is cancel-safe).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::StreamExt;
use pyo3::prelude::*;

use locksmith::backend::{GrantRecord, LockInfo};

use crate::blocking::{connect_options, Connection, LeaderStream};
use crate::convert::{self, configure};
use crate::errors::{self, IntoPyResult};
use crate::held::Held;
use crate::runtime::{self, awaitable};

/// Connects to the store the URL names; awaits the connection.
#[pyfunction]
#[pyo3(signature = (url, *, session_ttl=None, client_name=None, host=None))]
fn connect<'py>(
    py: Python<'py>,
    url: String,
    session_ttl: Option<&Bound<'_, PyAny>>,
    client_name: Option<String>,
    host: Option<String>,
) -> PyResult<Bound<'py, PyAny>> {
    let options = connect_options(session_ttl, client_name, host)?;
    awaitable(py, async move {
        let client = locksmith::Client::connect_with(&url, options).await.py()?;
        Ok(Client {
            connection: Connection::new(client),
        })
    })
}

/// Inspection results, made into Python objects when the awaitable
/// completes (with the GIL, off the runtime's workers).
enum Inspected {
    One(Option<LockInfo>),
    Many(Vec<LockInfo>),
    Grants(Vec<GrantRecord>),
    Leader(Option<locksmith::Leader>),
}

impl<'py> IntoPyObject<'py> for Inspected {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match self {
            Inspected::One(info) => match info {
                Some(info) => convert::lock_info(py, info),
                None => Ok(py.None().into_bound(py)),
            },
            Inspected::Many(infos) => convert::lock_infos(py, infos)?.into_pyobject(py),
            Inspected::Grants(grants) => convert::grants(py, grants)?.into_pyobject(py),
            Inspected::Leader(leader) => convert::leader(py, leader),
        }
    }
}

#[pyclass(module = "locksmith.aio", frozen)]
pub struct Client {
    connection: Arc<Connection>,
}

impl Client {
    fn lock_of(&self, lock: locksmith::Lock) -> Lock {
        Lock::new(self.connection.clone(), lock)
    }

    fn client(&self) -> PyResult<locksmith::Client> {
        self.connection.client().cloned()
    }
}

#[pymethods]
impl Client {
    /// An exclusive lock.
    #[pyo3(signature = (name, *, wait=None, lease=None, owner=None, reentrant=true, lock_delay=None))]
    fn lock(
        &self,
        name: String,
        wait: Option<&Bound<'_, PyAny>>,
        lease: Option<&Bound<'_, PyAny>>,
        owner: Option<String>,
        reentrant: bool,
        lock_delay: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Lock> {
        let lock = self.connection.client()?.lock(name);
        let lock = configure(lock, wait, lease, owner, reentrant, lock_delay)?;
        Ok(self.lock_of(lock))
    }

    /// A read-write lock: take its `read()` or `write()` side.
    fn rw_lock(&self, name: String) -> PyResult<RwLock> {
        Ok(RwLock {
            connection: self.connection.clone(),
            inner: self.connection.client()?.rw_lock(name),
        })
    }

    /// A semaphore: up to `permits` holders at once.
    #[pyo3(signature = (name, permits, *, wait=None, lease=None, owner=None, reentrant=true, lock_delay=None))]
    #[allow(clippy::too_many_arguments)]
    fn semaphore(
        &self,
        name: String,
        permits: u32,
        wait: Option<&Bound<'_, PyAny>>,
        lease: Option<&Bound<'_, PyAny>>,
        owner: Option<String>,
        reentrant: bool,
        lock_delay: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Lock> {
        let lock = self.connection.client()?.semaphore(name, permits);
        let lock = configure(lock, wait, lease, owner, reentrant, lock_delay)?;
        Ok(self.lock_of(lock))
    }

    /// Several exclusive locks taken all or nothing.
    #[pyo3(signature = (names, *, wait=None, lease=None, owner=None, reentrant=true, lock_delay=None))]
    fn multi_lock(
        &self,
        names: Vec<String>,
        wait: Option<&Bound<'_, PyAny>>,
        lease: Option<&Bound<'_, PyAny>>,
        owner: Option<String>,
        reentrant: bool,
        lock_delay: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Lock> {
        let lock = self.connection.client()?.multi_lock(names);
        let lock = configure(lock, wait, lease, owner, reentrant, lock_delay)?;
        Ok(self.lock_of(lock))
    }

    /// Leader election on a lock name.
    fn election(&self, name: String) -> PyResult<Election> {
        Ok(Election {
            connection: self.connection.clone(),
            inner: self.connection.client()?.election(name),
        })
    }

    /// Holders and waiters of one lock; `None` if nobody holds or waits.
    fn status<'py>(&self, py: Python<'py>, name: String) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client()?;
        awaitable(py, async move {
            Ok(Inspected::One(client.describe(&name).await.py()?))
        })
    }

    /// Every lock whose name starts with `prefix`, sorted by name.
    #[pyo3(signature = (prefix=String::new()))]
    fn list<'py>(&self, py: Python<'py>, prefix: String) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client()?;
        awaitable(py, async move {
            Ok(Inspected::Many(client.list(&prefix).await.py()?))
        })
    }

    /// Recent grants of the locks under `prefix` (the locksmith server only).
    #[pyo3(signature = (prefix=String::new()))]
    fn history<'py>(&self, py: Python<'py>, prefix: String) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client()?;
        awaitable(py, async move {
            Ok(Inspected::Grants(client.history(&prefix).await.py()?))
        })
    }

    /// Frees a lock whoever holds it; its holders see their guards lost.
    fn force_release<'py>(&self, py: Python<'py>, name: String) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client()?;
        awaitable(py, async move { client.force_release(&name).await.py() })
    }

    /// Releases everything this client holds and closes it.
    fn close<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client()?;
        awaitable(py, async move { client.close().await.py() })
    }

    #[getter]
    fn backend(&self) -> PyResult<&'static str> {
        Ok(self.connection.client()?.backend().name())
    }

    fn __aenter__<'py>(slf: Py<Self>, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, async move { Ok(slf) })
    }

    fn __aexit__<'py>(
        &self,
        py: Python<'py>,
        _exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _traceback: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client()?;
        awaitable(py, async move {
            client.close().await.py()?;
            Ok(false)
        })
    }

    fn __repr__(&self) -> String {
        let backend = self.backend().unwrap_or("forked");
        format!("<locksmith.aio.Client backend={backend:?}>")
    }
}

/// The asyncio task running now, to pair `__aenter__` with `__aexit__`.
fn current_task(py: Python<'_>) -> PyResult<usize> {
    let task = py.import("asyncio")?.call_method0("current_task")?;
    Ok(task.as_ptr() as usize)
}

/// Holds of `async with` blocks not yet exited, per asyncio task,
/// innermost last.
type Entered = Arc<Mutex<Vec<(usize, Arc<Held<locksmith::Guard>>)>>>;

/// A lock to acquire; `async with lock as guard:` acquires and releases.
#[pyclass(module = "locksmith.aio", frozen)]
pub struct Lock {
    connection: Arc<Connection>,
    inner: locksmith::Lock,
    entered: Entered,
}

impl Lock {
    fn new(connection: Arc<Connection>, inner: locksmith::Lock) -> Self {
        Lock {
            connection,
            inner,
            entered: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Acquires as the lock's options and `wait` say (see the blocking
    /// `Lock.acquire`).
    fn acquiring(
        &self,
        wait: Option<Duration>,
    ) -> PyResult<impl std::future::Future<Output = PyResult<Guard>> + Send + 'static> {
        self.connection.client()?;
        let lock = self.inner.clone();
        Ok(async move {
            let guard = match wait.or(lock.options().wait) {
                Some(wait) if wait.is_zero() => lock
                    .try_acquire()
                    .await
                    .py()?
                    .ok_or_else(|| errors::to_py(locksmith::Error::Timeout(Duration::ZERO)))?,
                Some(wait) => lock.acquire_timeout(wait).await.py()?,
                None => lock.acquire().await.py()?,
            };
            Ok(Guard::new(guard))
        })
    }
}

#[pymethods]
impl Lock {
    /// Acquires, waiting at most `wait` seconds (default: the lock's `wait`,
    /// else until granted); raises `Timeout` when the wait runs out.
    #[pyo3(signature = (wait=None))]
    fn acquire<'py>(
        &self,
        py: Python<'py>,
        wait: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let wait = convert::optional_duration(wait, "wait")?;
        awaitable(py, self.acquiring(wait)?)
    }

    /// Acquires only if that is possible right now; `None` when busy.
    fn try_acquire<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.connection.client()?;
        let lock = self.inner.clone();
        awaitable(py, async move {
            Ok(lock.try_acquire().await.py()?.map(Guard::new))
        })
    }

    #[getter]
    fn names(&self) -> Vec<String> {
        self.inner.names().to_vec()
    }

    #[getter]
    fn mode(&self) -> &'static str {
        convert::mode_parts(self.inner.mode()).0
    }

    #[getter]
    fn permits(&self) -> Option<u32> {
        convert::mode_parts(self.inner.mode()).1
    }

    fn __aenter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let task = current_task(py)?;
        let acquiring = self.acquiring(None)?;
        let entered = self.entered.clone();
        awaitable(py, async move {
            let guard = acquiring.await?;
            let mut entered = entered.lock().unwrap_or_else(|e| e.into_inner());
            entered.push((task, guard.held.clone()));
            Ok(guard)
        })
    }

    fn __aexit__<'py>(
        &self,
        py: Python<'py>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _traceback: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let task = current_task(py)?;
        let held = {
            let mut entered = self.entered.lock().unwrap_or_else(|e| e.into_inner());
            let last = entered.iter().rposition(|(owner, _)| *owner == task);
            last.map(|index| entered.remove(index).1)
        };
        let raising = exc_type.is_some_and(|exc_type| !exc_type.is_none());
        exit(py, held, raising)
    }

    fn __repr__(&self) -> String {
        format!(
            "<locksmith.aio.Lock {:?} {}>",
            self.inner.names(),
            convert::mode_text(self.inner.mode())
        )
    }
}

/// Releases at the end of an `async with` block: errors surface unless the
/// block is already raising.
fn exit<'py>(
    py: Python<'py>,
    held: Option<Arc<Held<locksmith::Guard>>>,
    raising: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let guard = match held {
        Some(held) if !held.is_released() => Some(held.take()?),
        _ => None,
    };
    awaitable(py, async move {
        if let Some(guard) = guard {
            let released = guard.release().await.py();
            if !raising {
                released?;
            }
        }
        Ok(false)
    })
}

/// A read-write lock: many readers or one writer, writers not starved.
#[pyclass(module = "locksmith.aio", frozen)]
pub struct RwLock {
    connection: Arc<Connection>,
    inner: locksmith::RwLock,
}

#[pymethods]
impl RwLock {
    /// The reader side (shared).
    #[pyo3(signature = (*, wait=None, lease=None, owner=None, reentrant=true, lock_delay=None))]
    fn read(
        &self,
        wait: Option<&Bound<'_, PyAny>>,
        lease: Option<&Bound<'_, PyAny>>,
        owner: Option<String>,
        reentrant: bool,
        lock_delay: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Lock> {
        let lock = configure(self.inner.read(), wait, lease, owner, reentrant, lock_delay)?;
        Ok(Lock::new(self.connection.clone(), lock))
    }

    /// The writer side (exclusive).
    #[pyo3(signature = (*, wait=None, lease=None, owner=None, reentrant=true, lock_delay=None))]
    fn write(
        &self,
        wait: Option<&Bound<'_, PyAny>>,
        lease: Option<&Bound<'_, PyAny>>,
        owner: Option<String>,
        reentrant: bool,
        lock_delay: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Lock> {
        let lock = configure(
            self.inner.write(),
            wait,
            lease,
            owner,
            reentrant,
            lock_delay,
        )?;
        Ok(Lock::new(self.connection.clone(), lock))
    }
}

/// Hands `callback(cause, reason)` to `event_loop`, thread-safely. A loop
/// that has closed since is left alone: nobody is there to call.
fn deliver_on_loop(
    callback: Py<PyAny>,
    event_loop: Py<PyAny>,
) -> impl FnOnce(Py<PyAny>, String) + Send + 'static {
    move |cause, reason| {
        runtime::with_python(|py| {
            let closed = event_loop
                .bind(py)
                .call_method0("is_closed")
                .and_then(|closed| closed.extract::<bool>())
                .unwrap_or(true);
            if !closed {
                let scheduled = event_loop
                    .bind(py)
                    .call_method1("call_soon_threadsafe", (callback, cause, reason));
                if let Err(error) = scheduled {
                    error.write_unraisable(py, None);
                }
            }
        });
    }
}

/// An awaitable of the hold's loss: its reason, or `None` once released.
fn lost_awaitable<'py, T: Send>(py: Python<'py>, held: &Held<T>) -> PyResult<Bound<'py, PyAny>> {
    held.check()?;
    let lost = held.lost_or_released();
    awaitable(py, async move { Ok(lost.await) })
}

fn running_loop(py: Python<'_>) -> PyResult<Py<PyAny>> {
    Ok(py
        .import("asyncio")?
        .call_method0("get_running_loop")?
        .unbind())
}

/// A held lock (or several, for a multi-lock).
#[pyclass(module = "locksmith.aio", frozen)]
pub struct Guard {
    held: Arc<Held<locksmith::Guard>>,
    names: Vec<String>,
    tokens: Vec<u64>,
}

impl Guard {
    fn new(guard: locksmith::Guard) -> Self {
        Guard {
            names: guard.names().to_vec(),
            tokens: guard.fencing_tokens().to_vec(),
            held: Arc::new(Held::new(
                guard.name().to_owned(),
                guard.lost_signal(),
                guard,
            )),
        }
    }
}

#[pymethods]
impl Guard {
    #[getter]
    fn fencing_token(&self) -> u64 {
        self.tokens[0]
    }

    #[getter]
    fn fencing_tokens(&self) -> Vec<u64> {
        self.tokens.clone()
    }

    #[getter]
    fn name(&self) -> &str {
        &self.names[0]
    }

    #[getter]
    fn names(&self) -> Vec<String> {
        self.names.clone()
    }

    #[getter]
    fn hold_count(&self) -> u32 {
        self.held.read(|guard| guard.hold_count()).unwrap_or(0)
    }

    #[getter]
    fn remaining_lease(&self) -> Option<f64> {
        self.held
            .read(|guard| guard.remaining_lease())
            .flatten()
            .map(|left| left.as_secs_f64())
    }

    #[getter]
    fn is_lost(&self) -> bool {
        self.held.lost().is_fired()
    }

    #[getter]
    fn lost_cause<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.held.lost_cause(py)
    }

    #[getter]
    fn lost_reason(&self) -> Option<String> {
        self.held.lost().reason()
    }

    fn raise_if_lost(&self, py: Python<'_>) -> PyResult<()> {
        self.held.raise_if_lost(py)
    }

    /// Completes with the reason once the hold is lost (`None` once it is
    /// released first).
    fn lost<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        lost_awaitable(py, &self.held)
    }

    /// Calls `callback(cause, reason)` on the running event loop when the
    /// hold is lost (at once if it was); not after a release.
    fn on_lost(&self, py: Python<'_>, callback: Py<PyAny>) -> PyResult<()> {
        let event_loop = running_loop(py)?;
        self.held.on_lost(deliver_on_loop(callback, event_loop))
    }

    /// Extends a leased hold to `lease` seconds from now.
    fn extend<'py>(
        &self,
        py: Python<'py>,
        lease: &Bound<'_, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let lease = convert::duration(lease, "lease")?;
        let held = self.held.clone();
        let guard = held.borrow()?;
        awaitable(py, async move {
            let extended = guard.extend(lease).await;
            held.put(guard);
            extended.py()
        })
    }

    /// Releases the hold; raises if it was lost or already released.
    fn release<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let guard = self.held.take()?;
        awaitable(py, async move { guard.release().await.py() })
    }

    fn __aenter__<'py>(slf: Py<Self>, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, async move { Ok(slf) })
    }

    fn __aexit__<'py>(
        &self,
        py: Python<'py>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _traceback: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let raising = exc_type.is_some_and(|exc_type| !exc_type.is_none());
        exit(py, Some(self.held.clone()), raising)
    }

    fn __repr__(&self) -> String {
        format!(
            "<locksmith.aio.Guard {:?} fencing_tokens={:?}{}>",
            self.names,
            self.tokens,
            if self.held.is_released() {
                " released"
            } else {
                ""
            }
        )
    }
}

/// An election on one lock name.
#[pyclass(module = "locksmith.aio", frozen)]
pub struct Election {
    connection: Arc<Connection>,
    inner: locksmith::Election,
}

#[pymethods]
impl Election {
    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }

    /// Waits until this candidate leads, publishing `value`; raises
    /// `Timeout` after `wait` seconds if given.
    #[pyo3(signature = (value, *, wait=None))]
    fn campaign<'py>(
        &self,
        py: Python<'py>,
        value: String,
        wait: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.connection.client()?;
        let wait = convert::optional_duration(wait, "wait")?;
        let election = self.inner.clone();
        awaitable(py, async move {
            let campaign = election.campaign(value);
            let leadership = match wait {
                Some(wait) => runtime::within(wait, campaign)
                    .await
                    .ok_or_else(|| errors::to_py(locksmith::Error::Timeout(wait)))?,
                None => campaign.await,
            }
            .py()?;
            Ok(Leadership::new(leadership))
        })
    }

    /// The current leader, or `None`.
    fn leader<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.connection.client()?;
        let election = self.inner.clone();
        awaitable(py, async move {
            Ok(Inspected::Leader(election.leader().await.py()?))
        })
    }

    /// An async iterator over the leader now and every change (`None`:
    /// nobody leads).
    fn observe(&self) -> PyResult<Observer> {
        self.connection.client()?;
        Ok(Observer {
            connection: self.connection.clone(),
            stream: Arc::new(tokio::sync::Mutex::new(self.inner.observe().boxed())),
        })
    }

    fn __repr__(&self) -> String {
        format!("<locksmith.aio.Election {:?}>", self.inner.name())
    }
}

/// This candidate's leadership until resigned, dropped or lost.
#[pyclass(module = "locksmith.aio", frozen)]
pub struct Leadership {
    held: Arc<Held<locksmith::Leadership>>,
    value: Arc<Mutex<String>>,
    token: u64,
}

impl Leadership {
    fn new(leadership: locksmith::Leadership) -> Self {
        let guard = leadership.guard();
        Leadership {
            value: Arc::new(Mutex::new(leadership.value().to_owned())),
            token: leadership.fencing_token(),
            held: Arc::new(Held::new(
                guard.name().to_owned(),
                guard.lost_signal(),
                leadership,
            )),
        }
    }

    fn resigning(
        &self,
        raising: bool,
    ) -> PyResult<impl std::future::Future<Output = PyResult<bool>> + Send + 'static> {
        let leadership = if self.held.is_released() {
            None
        } else {
            Some(self.held.take()?)
        };
        Ok(async move {
            if let Some(leadership) = leadership {
                let resigned = leadership.resign().await.py();
                if !raising {
                    resigned?;
                }
            }
            Ok(false)
        })
    }
}

#[pymethods]
impl Leadership {
    #[getter]
    fn value(&self) -> String {
        self.value.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    #[getter]
    fn fencing_token(&self) -> u64 {
        self.token
    }

    #[getter]
    fn is_lost(&self) -> bool {
        self.held.lost().is_fired()
    }

    #[getter]
    fn lost_cause<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.held.lost_cause(py)
    }

    #[getter]
    fn lost_reason(&self) -> Option<String> {
        self.held.lost().reason()
    }

    fn raise_if_lost(&self, py: Python<'_>) -> PyResult<()> {
        self.held.raise_if_lost(py)
    }

    fn lost<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        lost_awaitable(py, &self.held)
    }

    fn on_lost(&self, py: Python<'_>, callback: Py<PyAny>) -> PyResult<()> {
        let event_loop = running_loop(py)?;
        self.held.on_lost(deliver_on_loop(callback, event_loop))
    }

    /// Publishes a new value while leading (memory, etcd and ZooKeeper).
    fn proclaim<'py>(&self, py: Python<'py>, value: String) -> PyResult<Bound<'py, PyAny>> {
        let held = self.held.clone();
        let published = self.value.clone();
        let mut leadership = held.borrow()?;
        awaitable(py, async move {
            let proclaimed = leadership.proclaim(value.clone()).await;
            held.put(leadership);
            proclaimed.py()?;
            *published.lock().unwrap_or_else(|e| e.into_inner()) = value;
            Ok(())
        })
    }

    /// Steps down: the next candidate leads.
    fn resign<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let leadership = self.held.take()?;
        awaitable(py, async move { leadership.resign().await.py() })
    }

    fn __aenter__<'py>(slf: Py<Self>, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, async move { Ok(slf) })
    }

    fn __aexit__<'py>(
        &self,
        py: Python<'py>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _traceback: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let raising = exc_type.is_some_and(|exc_type| !exc_type.is_none());
        awaitable(py, self.resigning(raising)?)
    }

    fn __repr__(&self) -> String {
        format!(
            "<locksmith.aio.Leadership value={:?} fencing_token={}>",
            self.value(),
            self.token
        )
    }
}

/// The leader now and at every change, as an async iterator. A failed read
/// raises, and the next `__anext__` carries on.
#[pyclass(module = "locksmith.aio", frozen)]
pub struct Observer {
    connection: Arc<Connection>,
    stream: Arc<tokio::sync::Mutex<LeaderStream>>,
}

#[pymethods]
impl Observer {
    fn __aiter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __anext__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.connection.client()?;
        let stream = self.stream.clone();
        awaitable(py, async move {
            let next = stream.lock().await.next().await;
            match next {
                Some(leader) => Ok(Inspected::Leader(leader.py()?)),
                None => Err(pyo3::exceptions::PyStopAsyncIteration::new_err(())),
            }
        })
    }
}

/// Registers the asyncio API in the native module's `aio` submodule.
pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(connect, module)?)?;
    module.add_class::<Client>()?;
    module.add_class::<Lock>()?;
    module.add_class::<RwLock>()?;
    module.add_class::<Guard>()?;
    module.add_class::<Election>()?;
    module.add_class::<Leadership>()?;
    module.add_class::<Observer>()?;
    Ok(())
}
