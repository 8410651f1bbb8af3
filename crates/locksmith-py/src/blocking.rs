//! The blocking API (`locksmith.connect`, `Client`, `Lock`, `Guard`, ...):
//! the classes of [`crate::shared`] with the calls that wait, each run on
//! the calling thread with the GIL released and interruptible by Ctrl-C
//! ([`runtime::block`]).

use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use futures::stream::StreamExt;
use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

use crate::convert;
use crate::errors::IntoPyResult;
use crate::held::{Held, Hold, LossCallbacks};
use crate::runtime::{self, block};
use crate::shared::{
    connect_options, ClientBase, Connection, ElectionBase, Flavor, GuardBase, LeaderStream,
    LeadershipBase, LockBase, RwLockBase,
};

/// The blocking API's classes over the bases of `shared`.
const FLAVOR: Flavor = crate::shared::this_flavor!();

/// Connects to the store the URL names, blocking until connected.
#[pyfunction]
#[pyo3(signature = (url, *, session_ttl=None, client_name=None, host=None))]
pub fn connect<'py>(
    py: Python<'py>,
    url: &str,
    session_ttl: Option<&Bound<'_, PyAny>>,
    client_name: Option<String>,
    host: Option<String>,
) -> PyResult<Bound<'py, Client>> {
    let options = connect_options(session_ttl, client_name, host)?;
    let client = block(py, locksmith::Client::connect_with(url, options))?.py()?;
    let base = ClientBase::new(FLAVOR, client);
    Bound::new(py, PyClassInitializer::from(base).add_subclass(Client))
}

/// A connection to one lock store; `with` closes it.
#[pyclass(module = "locksmith", extends = ClientBase, frozen)]
pub struct Client;

fn client_of<'a>(slf: &'a Bound<'_, Client>) -> PyResult<&'a locksmith::Client> {
    slf.as_super().get().connection.client()
}

#[pymethods]
impl Client {
    /// Holders and waiters of one lock; `None` if nobody holds or waits.
    fn status<'py>(slf: &Bound<'py, Self>, name: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
        let py = slf.py();
        block(py, client_of(slf)?.describe(name))?
            .py()?
            .map(|info| convert::lock_info(py, info))
            .transpose()
    }

    /// Every lock whose name starts with `prefix`, sorted by name.
    #[pyo3(signature = (prefix=""))]
    fn list<'py>(slf: &Bound<'py, Self>, prefix: &str) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let py = slf.py();
        let infos = block(py, client_of(slf)?.list(prefix))?.py()?;
        convert::lock_infos(py, infos)
    }

    /// Recent grants of the locks under `prefix` (the locksmith server only).
    #[pyo3(signature = (prefix=""))]
    fn history<'py>(slf: &Bound<'py, Self>, prefix: &str) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let py = slf.py();
        let grants = block(py, client_of(slf)?.history(prefix))?.py()?;
        convert::grants(py, grants)
    }

    /// Frees a lock whoever holds it; its holders see their guards lost.
    fn force_release(slf: &Bound<'_, Self>, name: &str) -> PyResult<()> {
        block(slf.py(), client_of(slf)?.force_release(name))?.py()
    }

    /// Releases everything this client holds and closes it.
    fn close(slf: &Bound<'_, Self>) -> PyResult<()> {
        block(slf.py(), client_of(slf)?.close())?.py()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        slf: &Bound<'_, Self>,
        _exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _traceback: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        Self::close(slf)?;
        Ok(false)
    }
}

/// A lock to acquire; `with lock as guard:` acquires and releases.
#[pyclass(module = "locksmith", extends = LockBase, frozen)]
pub struct Lock {
    /// Holds of `with` blocks not yet exited, per thread, innermost last.
    entered: Mutex<Vec<(ThreadId, Arc<Held<locksmith::Guard>>)>>,
}

impl Lock {
    pub fn new(base: LockBase) -> PyClassInitializer<Self> {
        PyClassInitializer::from(base).add_subclass(Lock {
            entered: Mutex::new(Vec::new()),
        })
    }

    fn acquire_for<'py>(
        slf: &Bound<'py, Self>,
        wait: Option<std::time::Duration>,
    ) -> PyResult<Bound<'py, Guard>> {
        let py = slf.py();
        let guard = block(py, slf.as_super().get().acquiring(wait)?)??;
        Bound::new(py, Guard::new(guard))
    }
}

#[pymethods]
impl Lock {
    /// Acquires, waiting at most `wait` seconds (default: the lock's `wait`,
    /// else until granted); raises `Timeout` when the wait runs out.
    #[pyo3(signature = (wait=None))]
    fn acquire<'py>(
        slf: &Bound<'py, Self>,
        wait: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Bound<'py, Guard>> {
        let wait = convert::optional_duration(wait, "wait")?;
        Self::acquire_for(slf, wait)
    }

    /// Acquires only if that is possible right now; `None` when busy.
    fn try_acquire<'py>(slf: &Bound<'py, Self>) -> PyResult<Option<Bound<'py, Guard>>> {
        let py = slf.py();
        let guard = block(py, slf.as_super().get().trying()?)??;
        guard
            .map(|guard| Bound::new(py, Guard::new(guard)))
            .transpose()
    }

    fn __enter__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, Guard>> {
        let guard = Self::acquire_for(slf, None)?;
        let held = guard.as_super().get().held.clone();
        let mut entered = slf.get().entered.lock().unwrap_or_else(|e| e.into_inner());
        entered.push((std::thread::current().id(), held));
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
        let held = {
            let mut entered = self.entered.lock().unwrap_or_else(|e| e.into_inner());
            let last = entered.iter().rposition(|(owner, _)| *owner == thread);
            last.map(|index| entered.remove(index).1)
        };
        match held {
            Some(held) => exit(py, &held, exc_type, |guard| guard.release()),
            None => Ok(false),
        }
    }
}

/// Ends a hold at the end of a `with` block (`end` releases or resigns):
/// errors surface unless the block is already raising. A hold lent to a
/// call running in another thread (`extend`, `proclaim`) is ended once that
/// call returns (see [`held::Taken::wait`](crate::held::Taken::wait)).
fn exit<T, F>(
    py: Python<'_>,
    held: &Held<T>,
    exc_type: Option<&Bound<'_, PyAny>>,
    end: impl FnOnce(T) -> F,
) -> PyResult<bool>
where
    T: Send,
    F: std::future::Future<Output = locksmith::Result<()>> + Send,
{
    if held.is_released() {
        return Ok(false);
    }
    let ended = match held.take()?.wait(py)? {
        Some(hold) => block(py, end(hold)).and_then(IntoPyResult::py),
        None => Ok(()),
    };
    match exc_type {
        Some(exc_type) if !exc_type.is_none() => Ok(false),
        _ => ended.map(|()| false),
    }
}

/// A read-write lock: many readers or one writer; writers are not starved
/// where the store queues waiters in order (not on Redis outside
/// `mode=fair`, nor over Redlock).
#[pyclass(module = "locksmith", extends = RwLockBase, frozen)]
pub struct RwLock;

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

/// A held lock (or several, for a multi-lock).
#[pyclass(module = "locksmith", extends = GuardBase, frozen)]
pub struct Guard {
    /// Its `on_lost` callbacks, kept here for the garbage collector to see.
    callbacks: LossCallbacks,
}

impl Guard {
    fn new(held: Arc<Held<locksmith::Guard>>) -> PyClassInitializer<Self> {
        GuardBase::new(held).add_subclass(Guard {
            callbacks: LossCallbacks::default(),
        })
    }
}

fn guard_held<'a>(slf: &'a Bound<'_, Guard>) -> &'a Arc<Held<locksmith::Guard>> {
    &slf.as_super().get().held
}

#[pymethods]
impl Guard {
    /// Blocks until the hold is lost (its reason), or is released or
    /// `timeout` passes (`None`).
    #[pyo3(signature = (timeout=None))]
    fn lost(slf: &Bound<'_, Self>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<Option<String>> {
        wait_lost(slf.py(), guard_held(slf), timeout)
    }

    /// Calls `callback(cause, reason)` on a background thread when the hold
    /// is lost (at once if it was); not after a release. The guard keeps
    /// the callback: a guard collected takes its callbacks with it, even
    /// one in a reference cycle with them (and is released in the
    /// background, as any guard dropped while held).
    fn on_lost(slf: &Bound<'_, Self>, callback: Py<PyAny>) -> PyResult<()> {
        guard_held(slf).on_lost(&slf.get().callbacks, callback)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.callbacks.traverse(&visit)
    }

    fn __clear__(&self) {
        self.callbacks.clear();
    }

    /// Extends a leased hold to `lease` seconds from now. A `release` from
    /// another thread meanwhile waits for this to return.
    fn extend(slf: &Bound<'_, Self>, lease: &Bound<'_, PyAny>) -> PyResult<()> {
        let lease = convert::duration(lease, "lease")?;
        let guard = guard_held(slf).lend()?;
        block(slf.py(), guard.extend(lease))?.py()
    }

    /// Releases the hold; raises if it was lost or already released.
    /// While an `extend` runs in another thread, waits for it to return,
    /// then releases; from a signal handler that interrupted this thread's
    /// own `extend`, returns at once and the hold is released in the
    /// background when that `extend` returns.
    fn release(slf: &Bound<'_, Self>) -> PyResult<()> {
        match guard_held(slf).take()?.wait(slf.py())? {
            Some(guard) => block(slf.py(), guard.release())?.py(),
            None => Ok(()),
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        slf: &Bound<'_, Self>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _traceback: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        exit(slf.py(), guard_held(slf), exc_type, |guard| guard.release())
    }
}

/// An election on one lock name.
#[pyclass(module = "locksmith", extends = ElectionBase, frozen)]
pub struct Election;

#[pymethods]
impl Election {
    /// Waits until this candidate leads, publishing `value`; raises
    /// `Timeout` after `wait` seconds if given.
    #[pyo3(signature = (value, *, wait=None))]
    fn campaign<'py>(
        slf: &Bound<'py, Self>,
        value: String,
        wait: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Bound<'py, Leadership>> {
        let py = slf.py();
        let wait = convert::optional_duration(wait, "wait")?;
        let leadership = block(py, slf.as_super().get().campaigning(value, wait)?)??;
        Bound::new(py, Leadership::new(leadership))
    }

    /// The current leader, or `None`.
    fn leader<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let base = slf.as_super().get();
        base.connection.client()?;
        let leader = block(py, base.inner.leader())?.py()?;
        convert::leader(py, leader)
    }

    /// An iterator over the leader now and every change (`None`: nobody leads).
    fn observe(slf: &Bound<'_, Self>) -> PyResult<Observer> {
        let base = slf.as_super().get();
        base.connection.client()?;
        Ok(Observer {
            connection: base.connection.clone(),
            stream: Mutex::new(Some(base.inner.observe().boxed())),
        })
    }
}

/// This candidate's leadership until resigned, dropped or lost.
#[pyclass(module = "locksmith", extends = LeadershipBase, frozen)]
pub struct Leadership {
    /// Its `on_lost` callbacks, kept here for the garbage collector to see.
    callbacks: LossCallbacks,
}

impl Leadership {
    fn new(leadership: locksmith::Leadership) -> PyClassInitializer<Self> {
        LeadershipBase::new(leadership).add_subclass(Leadership {
            callbacks: LossCallbacks::default(),
        })
    }
}

#[pymethods]
impl Leadership {
    /// Blocks until leadership is lost (its reason), or is resigned or
    /// `timeout` passes (`None`).
    #[pyo3(signature = (timeout=None))]
    fn lost(slf: &Bound<'_, Self>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<Option<String>> {
        wait_lost(slf.py(), &slf.as_super().get().held, timeout)
    }

    /// Calls `callback(cause, reason)` on a background thread when
    /// leadership is lost (at once if it was); not after a resign. The
    /// leadership keeps the callback (as `Guard.on_lost`).
    fn on_lost(slf: &Bound<'_, Self>, callback: Py<PyAny>) -> PyResult<()> {
        let held = &slf.as_super().get().held;
        held.on_lost(&slf.get().callbacks, callback)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.callbacks.traverse(&visit)
    }

    fn __clear__(&self) {
        self.callbacks.clear();
    }

    /// Publishes a new value while leading (memory, etcd and ZooKeeper).
    /// A `resign` from another thread meanwhile waits for this to return.
    fn proclaim(slf: &Bound<'_, Self>, value: String) -> PyResult<()> {
        let base = slf.as_super().get();
        let mut leadership = base.held.lend()?;
        block(slf.py(), leadership.proclaim(value.clone()))?.py()?;
        *base.value.lock().unwrap_or_else(|e| e.into_inner()) = value;
        Ok(())
    }

    /// Steps down: the next candidate leads. While a `proclaim` runs in
    /// another thread, waits for it to return, then resigns (from a signal
    /// handler that interrupted this thread's own `proclaim`: as
    /// `Guard.release`).
    fn resign(slf: &Bound<'_, Self>) -> PyResult<()> {
        match slf.as_super().get().held.take()?.wait(slf.py())? {
            Some(leadership) => block(slf.py(), leadership.resign())?.py(),
            None => Ok(()),
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        slf: &Bound<'_, Self>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _traceback: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let held = &slf.as_super().get().held;
        exit(slf.py(), held, exc_type, |leadership| leadership.resign())
    }
}

/// The leader now and at every change; each `next()` blocks until then.
/// A failed read raises, and the next `next()` carries on.
#[pyclass(module = "locksmith", frozen)]
pub struct Observer {
    connection: Arc<Connection>,
    stream: Mutex<Option<LeaderStream>>,
}

impl Drop for Observer {
    /// The stream is dropped in the runtime's context, as its client is; in
    /// a forked child it is forgotten: it belongs to the parent's runtime,
    /// and dropping it may take a lock of the parent's connection (or
    /// `memory://` table) that a thread of the parent held at the fork, for
    /// ever in the child.
    fn drop(&mut self) {
        let stream = self
            .stream
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let Some(stream) = stream else {
            return;
        };
        if self.connection.generation() == runtime::generation() {
            let _entered = runtime::runtime().enter();
            drop(stream);
        } else {
            std::mem::forget(stream);
        }
    }
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
