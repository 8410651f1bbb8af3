//! The blocking API (`locksmith.connect`, `Client`, `Lock`, `Guard`, ...):
//! every call that waits runs on the calling thread with the GIL released
//! and can be interrupted by Ctrl-C ([`runtime::block`]).

use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::Duration;

use futures::stream::{BoxStream, StreamExt};
use pyo3::prelude::*;

use crate::convert::{self, configure};
use crate::errors::{self, IntoPyResult};
use crate::held::{self, Held};
use crate::runtime::{self, block};

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

/// Connects to the store the URL names, blocking until connected.
#[pyfunction]
#[pyo3(signature = (url, *, session_ttl=None, client_name=None, host=None))]
pub fn connect(
    py: Python<'_>,
    url: &str,
    session_ttl: Option<&Bound<'_, PyAny>>,
    client_name: Option<String>,
    host: Option<String>,
) -> PyResult<Client> {
    let options = connect_options(session_ttl, client_name, host)?;
    let client = block(py, locksmith::Client::connect_with(url, options))?.py()?;
    Ok(Client::new(client))
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

#[pyclass(module = "locksmith", frozen)]
pub struct Client {
    connection: Arc<Connection>,
}

impl Client {
    fn new(client: locksmith::Client) -> Self {
        Client {
            connection: Connection::new(client),
        }
    }

    fn lock_of(&self, lock: locksmith::Lock) -> Lock {
        Lock::new(self.connection.clone(), lock)
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
    fn status<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
        let client = self.connection.client()?;
        block(py, client.describe(name))?
            .py()?
            .map(|info| convert::lock_info(py, info))
            .transpose()
    }

    /// Every lock whose name starts with `prefix`, sorted by name.
    #[pyo3(signature = (prefix=""))]
    fn list<'py>(&self, py: Python<'py>, prefix: &str) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let client = self.connection.client()?;
        let infos = block(py, client.list(prefix))?.py()?;
        convert::lock_infos(py, infos)
    }

    /// Recent grants of the locks under `prefix` (the locksmith server only).
    #[pyo3(signature = (prefix=""))]
    fn history<'py>(&self, py: Python<'py>, prefix: &str) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let client = self.connection.client()?;
        let grants = block(py, client.history(prefix))?.py()?;
        convert::grants(py, grants)
    }

    /// Frees a lock whoever holds it; its holders see their guards lost.
    fn force_release(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        let client = self.connection.client()?;
        block(py, client.force_release(name))?.py()
    }

    /// Releases everything this client holds and closes it.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let client = self.connection.client()?;
        block(py, client.close())?.py()
    }

    /// The backend's name: `memory`, `server`, `redis`, `zookeeper`, `etcd`, `postgres`.
    #[getter]
    fn backend(&self) -> &'static str {
        self.connection.get().backend().name()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _traceback: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!("<locksmith.Client backend={:?}>", self.backend())
    }
}

/// A lock to acquire; `with lock as guard:` acquires and releases.
#[pyclass(module = "locksmith", frozen)]
pub struct Lock {
    connection: Arc<Connection>,
    inner: locksmith::Lock,
    /// Guards of `with` blocks not yet exited, per thread, innermost last.
    entered: Mutex<Vec<(ThreadId, Py<Guard>)>>,
}

impl Lock {
    fn new(connection: Arc<Connection>, inner: locksmith::Lock) -> Self {
        Lock {
            connection,
            inner,
            entered: Mutex::new(Vec::new()),
        }
    }

    fn acquire_for(&self, py: Python<'_>, wait: Option<Duration>) -> PyResult<Guard> {
        self.connection.client()?;
        let lock = &self.inner;
        let guard = match wait.or(lock.options().wait) {
            Some(wait) if wait.is_zero() => block(py, lock.try_acquire())?
                .py()?
                .ok_or_else(|| errors::to_py(locksmith::Error::Timeout(Duration::ZERO)))?,
            Some(wait) => block(py, lock.acquire_timeout(wait))?.py()?,
            None => block(py, lock.acquire())?.py()?,
        };
        Ok(Guard::new(guard))
    }
}

#[pymethods]
impl Lock {
    /// Acquires, waiting at most `wait` seconds (default: the lock's `wait`,
    /// else until granted); raises `Timeout` when the wait runs out.
    #[pyo3(signature = (wait=None))]
    fn acquire(&self, py: Python<'_>, wait: Option<&Bound<'_, PyAny>>) -> PyResult<Guard> {
        let wait = convert::optional_duration(wait, "wait")?;
        self.acquire_for(py, wait)
    }

    /// Acquires only if that is possible right now; `None` when busy.
    fn try_acquire(&self, py: Python<'_>) -> PyResult<Option<Guard>> {
        self.connection.client()?;
        let guard = block(py, self.inner.try_acquire())?.py()?;
        Ok(guard.map(Guard::new))
    }

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

    fn __enter__(&self, py: Python<'_>) -> PyResult<Py<Guard>> {
        let guard = Py::new(py, self.acquire_for(py, None)?)?;
        let mut entered = self.entered.lock().unwrap_or_else(|e| e.into_inner());
        entered.push((std::thread::current().id(), guard.clone_ref(py)));
        Ok(guard)
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _traceback: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let thread = std::thread::current().id();
        let guard = {
            let mut entered = self.entered.lock().unwrap_or_else(|e| e.into_inner());
            let last = entered.iter().rposition(|(owner, _)| *owner == thread);
            last.map(|index| entered.remove(index).1)
        };
        match guard {
            Some(guard) => guard.get().exit(py, exc_type),
            None => Ok(false),
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "<locksmith.Lock {:?} {}>",
            self.inner.names(),
            convert::mode_text(self.inner.mode())
        )
    }
}

/// A read-write lock: many readers or one writer, writers not starved.
#[pyclass(module = "locksmith", frozen)]
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

/// Waits until the hold is lost (its reason), released (`None`) or
/// `timeout` passes (`None`).
fn wait_lost<T: Send>(
    py: Python<'_>,
    held: &Held<T>,
    timeout: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<String>> {
    held.check()?;
    let timeout = convert::optional_duration(timeout, "timeout")?;
    let lost = held.lost_or_released();
    match timeout {
        Some(timeout) => Ok(block(py, runtime::within(timeout, lost))?.flatten()),
        None => block(py, lost),
    }
}

/// Runs `callback` on a background thread.
fn deliver_on_thread(callback: Py<PyAny>) -> impl FnOnce(Py<PyAny>, String) + Send + 'static {
    move |cause, reason| held::call_here(callback, cause, reason)
}

/// A held lock (or several, for a multi-lock).
#[pyclass(module = "locksmith", frozen)]
pub struct Guard {
    held: Held<locksmith::Guard>,
    names: Vec<String>,
    tokens: Vec<u64>,
}

impl Guard {
    fn new(guard: locksmith::Guard) -> Self {
        Guard {
            names: guard.names().to_vec(),
            tokens: guard.fencing_tokens().to_vec(),
            held: Held::new(guard.name().to_owned(), guard.lost_signal(), guard),
        }
    }

    /// Releases at the end of a `with` block: errors surface unless the
    /// block is already raising.
    fn exit(&self, py: Python<'_>, exc_type: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
        if self.held.is_released() {
            return Ok(false);
        }
        let released = self.release(py);
        match exc_type {
            Some(exc_type) if !exc_type.is_none() => Ok(false),
            _ => released.map(|()| false),
        }
    }
}

#[pymethods]
impl Guard {
    /// The fencing token of the (first) lock.
    #[getter]
    fn fencing_token(&self) -> u64 {
        self.tokens[0]
    }

    /// Fencing tokens of every lock of a multi-lock, in order.
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

    #[getter]
    fn is_lost(&self) -> bool {
        self.held.lost().is_fired()
    }

    /// Why the hold was lost (a `LostCause`), once it was.
    #[getter]
    fn lost_cause<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.held.lost_cause(py)
    }

    /// Why the hold was lost, in words, once it was.
    #[getter]
    fn lost_reason(&self) -> Option<String> {
        self.held.lost().reason()
    }

    /// Raises `Lost` if the hold was lost.
    fn raise_if_lost(&self, py: Python<'_>) -> PyResult<()> {
        self.held.raise_if_lost(py)
    }

    /// Blocks until the hold is lost (its reason), or is released or
    /// `timeout` passes (`None`).
    #[pyo3(signature = (timeout=None))]
    fn lost(&self, py: Python<'_>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<Option<String>> {
        wait_lost(py, &self.held, timeout)
    }

    /// Calls `callback(cause, reason)` on a background thread when the hold
    /// is lost (at once if it was); not after a release.
    fn on_lost(&self, callback: Py<PyAny>) -> PyResult<()> {
        self.held.on_lost(deliver_on_thread(callback))
    }

    /// Extends a leased hold to `lease` seconds from now.
    fn extend(&self, py: Python<'_>, lease: &Bound<'_, PyAny>) -> PyResult<()> {
        let lease = convert::duration(lease, "lease")?;
        let guard = self.held.borrow()?;
        let extended = block(py, guard.extend(lease));
        self.held.put(guard);
        extended?.py()
    }

    /// Releases the hold; raises if it was lost or already released.
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        let guard = self.held.take()?;
        block(py, guard.release())?.py()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _traceback: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        self.exit(py, exc_type)
    }

    fn __repr__(&self) -> String {
        format!(
            "<locksmith.Guard {:?} fencing_tokens={:?}{}>",
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
#[pyclass(module = "locksmith", frozen)]
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
    fn campaign(
        &self,
        py: Python<'_>,
        value: String,
        wait: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Leadership> {
        self.connection.client()?;
        let wait = convert::optional_duration(wait, "wait")?;
        let campaign = self.inner.campaign(value);
        let leadership = match wait {
            Some(wait) => block(py, runtime::within(wait, campaign))?
                .ok_or_else(|| errors::to_py(locksmith::Error::Timeout(wait)))?,
            None => block(py, campaign)?,
        }
        .py()?;
        Ok(Leadership::new(leadership))
    }

    /// The current leader, or `None`.
    fn leader<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.connection.client()?;
        let leader = block(py, self.inner.leader())?.py()?;
        convert::leader(py, leader)
    }

    /// An iterator over the leader now and every change (`None`: nobody leads).
    fn observe(&self) -> PyResult<Observer> {
        self.connection.client()?;
        Ok(Observer {
            connection: self.connection.clone(),
            stream: Mutex::new(Some(self.inner.observe().boxed())),
        })
    }

    fn __repr__(&self) -> String {
        format!("<locksmith.Election {:?}>", self.inner.name())
    }
}

/// This candidate's leadership until resigned, dropped or lost.
#[pyclass(module = "locksmith", frozen)]
pub struct Leadership {
    held: Held<locksmith::Leadership>,
    value: Mutex<String>,
    token: u64,
}

impl Leadership {
    fn new(leadership: locksmith::Leadership) -> Self {
        let guard = leadership.guard();
        Leadership {
            value: Mutex::new(leadership.value().to_owned()),
            token: leadership.fencing_token(),
            held: Held::new(guard.name().to_owned(), guard.lost_signal(), leadership),
        }
    }
}

#[pymethods]
impl Leadership {
    /// The value this leader publishes now.
    #[getter]
    fn value(&self) -> String {
        self.value.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The fencing token of this term.
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

    #[pyo3(signature = (timeout=None))]
    fn lost(&self, py: Python<'_>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<Option<String>> {
        wait_lost(py, &self.held, timeout)
    }

    fn on_lost(&self, callback: Py<PyAny>) -> PyResult<()> {
        self.held.on_lost(deliver_on_thread(callback))
    }

    /// Publishes a new value while leading (memory, etcd and ZooKeeper).
    fn proclaim(&self, py: Python<'_>, value: String) -> PyResult<()> {
        let mut leadership = self.held.borrow()?;
        let proclaimed = block(py, leadership.proclaim(value.clone()));
        self.held.put(leadership);
        proclaimed?.py()?;
        *self.value.lock().unwrap_or_else(|e| e.into_inner()) = value;
        Ok(())
    }

    /// Steps down: the next candidate leads.
    fn resign(&self, py: Python<'_>) -> PyResult<()> {
        let leadership = self.held.take()?;
        block(py, leadership.resign())?.py()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _traceback: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        if self.held.is_released() {
            return Ok(false);
        }
        let resigned = self.resign(py);
        match exc_type {
            Some(exc_type) if !exc_type.is_none() => Ok(false),
            _ => resigned.map(|()| false),
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "<locksmith.Leadership value={:?} fencing_token={}>",
            self.value(),
            self.token
        )
    }
}

pub type LeaderStream = BoxStream<'static, locksmith::Result<Option<locksmith::Leader>>>;

/// The leader now and at every change; each `next()` blocks until then.
/// A failed read raises, and the next `next()` carries on.
#[pyclass(module = "locksmith", frozen)]
pub struct Observer {
    connection: Arc<Connection>,
    stream: Mutex<Option<LeaderStream>>,
}

#[pymethods]
impl Observer {
    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        runtime::check_generation(self.connection.generation())?;
        let taken = self.stream.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(mut stream) = taken else {
            return Err(pyo3::exceptions::PyRuntimeError::new_err(
                "another thread is waiting on this observer",
            ));
        };
        let next = block(py, stream.next());
        *self.stream.lock().unwrap_or_else(|e| e.into_inner()) = Some(stream);
        match next? {
            Some(leader) => convert::leader(py, leader.py()?),
            // The stream never ends; if it did, so would the iteration.
            None => Err(pyo3::exceptions::PyStopIteration::new_err(())),
        }
    }
}

/// Registers the blocking API in the native module.
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
