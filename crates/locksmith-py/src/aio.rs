//! The asyncio API (`locksmith.aio`): the classes of [`crate::shared`] with
//! the calls that wait returned as awaitables ([`crate::awaitable`]), which
//! the awaiting task drives. Each method's docs say what cancelling it
//! leaves (the awaitable drops the future when its task is cancelled).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures::stream::StreamExt;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::IntoPyDict;
use pyo3::{intern, IntoPyObjectExt, PyClass, PyTraverseError, PyVisit};

use locksmith::backend::{GrantRecord, LockInfo};
use locksmith::LostCause;

use crate::awaitable::{awaitable, awaitable_made, Awaitable};
use crate::convert;
use crate::errors;
use crate::errors::IntoPyResult;
use crate::held::{Held, Hold, LossCallbacks, Registered};
use crate::shared::{
    self, connect_options, ClientBase, Connection, ElectionBase, Flavor, GuardBase, LeaderStream,
    LeadershipBase, LockBase, RwLockBase,
};

/// The asyncio API's classes over the bases of `shared`.
const FLAVOR: Flavor = crate::shared::this_flavor!();

/// Connects to the store the URL names.
///
/// Cancel safety: safe; a cancelled connect leaves at most a session that
/// expires on its own.
#[pyfunction]
#[pyo3(signature = (url, *, session_ttl=None, client_name=None, host=None))]
fn connect(
    url: String,
    session_ttl: Option<&Bound<'_, PyAny>>,
    client_name: Option<String>,
    host: Option<String>,
) -> PyResult<Awaitable> {
    let options = connect_options(session_ttl, client_name, host)?;
    Ok(awaitable(async move {
        let client = locksmith::Client::connect_with(&url, options).await.py()?;
        let base = ClientBase::new(FLAVOR, client);
        Ok(Made(PyClassInitializer::from(base).add_subclass(Client)))
    }))
}

/// An object of class `T`, made when the future that returns it completes
/// (with the GIL, in the awaiting task).
struct Made<T: PyClass>(PyClassInitializer<T>);

impl<'py, T: PyClass> IntoPyObject<'py> for Made<T> {
    type Target = T;
    type Output = Bound<'py, T>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, T>> {
        Bound::new(py, self.0)
    }
}

/// Inspection results, made into Python objects when the awaitable
/// completes.
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

/// A connection to one lock store; `async with` closes it.
#[pyclass(module = "locksmith.aio", extends = ClientBase, frozen)]
pub struct Client;

fn client_of(slf: &Bound<'_, Client>) -> PyResult<locksmith::Client> {
    slf.as_super().get().connection.client().cloned()
}

#[pymethods]
impl Client {
    /// Holders and waiters of one lock; `None` if nobody holds or waits.
    ///
    /// Cancel safety: safe, read-only.
    fn status(slf: &Bound<'_, Self>, name: String) -> PyResult<Awaitable> {
        let client = client_of(slf)?;
        Ok(awaitable(async move {
            Ok(Inspected::One(client.describe(&name).await.py()?))
        }))
    }

    /// Every lock whose name starts with `prefix`, sorted by name.
    ///
    /// Cancel safety: safe, read-only.
    #[pyo3(signature = (prefix=String::new()))]
    fn list(slf: &Bound<'_, Self>, prefix: String) -> PyResult<Awaitable> {
        let client = client_of(slf)?;
        Ok(awaitable(async move {
            Ok(Inspected::Many(client.list(&prefix).await.py()?))
        }))
    }

    /// Recent grants of the locks under `prefix` (the locksmith server only).
    ///
    /// Cancel safety: safe, read-only.
    #[pyo3(signature = (prefix=String::new()))]
    fn history(slf: &Bound<'_, Self>, prefix: String) -> PyResult<Awaitable> {
        let client = client_of(slf)?;
        Ok(awaitable(async move {
            Ok(Inspected::Grants(client.history(&prefix).await.py()?))
        }))
    }

    /// Frees a lock whoever holds it; its holders see their guards lost.
    ///
    /// Cancel safety: the release may or may not have happened.
    fn force_release(slf: &Bound<'_, Self>, name: String) -> PyResult<Awaitable> {
        let client = client_of(slf)?;
        Ok(awaitable(
            async move { client.force_release(&name).await.py() },
        ))
    }

    /// Releases everything this client holds and closes it.
    ///
    /// Cancel safety: if cancelled midway, the holds not yet released end
    /// with the session.
    fn close(slf: &Bound<'_, Self>) -> PyResult<Awaitable> {
        let client = client_of(slf)?;
        Ok(awaitable(async move { client.close().await.py() }))
    }

    fn __aenter__(slf: Py<Self>) -> Awaitable {
        awaitable(async move { Ok(slf) })
    }

    /// Closes the client (as `close`).
    fn __aexit__(
        slf: &Bound<'_, Self>,
        _exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _traceback: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Awaitable> {
        let client = client_of(slf)?;
        Ok(awaitable(async move {
            client.close().await.py()?;
            Ok(false)
        }))
    }
}

/// The `async with` blocks of locks open in the current context, as a
/// chain, innermost first, kept in a context variable.
///
/// asyncio runs each task in a context of its own, a copy of its creator's
/// made when the task starts, so a block entered in a task is found by
/// that task's exit and by no other: one lock object can be entered by
/// several tasks at once. A task that ends inside a block (its exit never
/// runs) takes its context and the block with it; the hold then ends as a
/// dropped guard's does, in the background once the guard is gone too.
/// A task started inside a block inherits it in its copy, which it can
/// only exit by calling `__aexit__` by hand.
///
/// (A map from the running task to its blocks needs that task, which
/// `asyncio.current_task()` finds with a system call on Python 3.11:
/// a context variable costs a fraction of it.)
#[pyclass(module = "locksmith.aio", frozen)]
struct OpenBlock {
    /// The lock's [`Lock::id`].
    lock: u64,
    held: Arc<Held<locksmith::Guard>>,
    outer: Option<Py<OpenBlock>>,
}

/// The bound `get` and `set` of the context variable holding the
/// innermost [`OpenBlock`] (or `None`).
fn open_blocks(py: Python<'_>) -> PyResult<&(Py<PyAny>, Py<PyAny>)> {
    static OPEN_BLOCKS: PyOnceLock<(Py<PyAny>, Py<PyAny>)> = PyOnceLock::new();
    OPEN_BLOCKS.get_or_try_init(py, || {
        let variable = py
            .import(intern!(py, "contextvars"))?
            .getattr(intern!(py, "ContextVar"))?
            .call(
                ("locksmith.aio.open_blocks",),
                Some(&[("default", py.None())].into_py_dict(py)?),
            )?;
        Ok((
            variable.getattr(intern!(py, "get"))?.unbind(),
            variable.getattr(intern!(py, "set"))?.unbind(),
        ))
    })
}

fn innermost_block(py: Python<'_>) -> PyResult<Option<Py<OpenBlock>>> {
    Ok(open_blocks(py)?.0.bind(py).call0()?.extract()?)
}

fn set_innermost_block(py: Python<'_>, block: Option<Py<OpenBlock>>) -> PyResult<()> {
    open_blocks(py)?.1.bind(py).call1((block,))?;
    Ok(())
}

/// A hold just acquired by `Lock.__aenter__`: made into its guard, with its
/// block opened in the context of the task that awaited the acquire.
struct Entered {
    lock: u64,
    held: Arc<Held<locksmith::Guard>>,
}

impl<'py> IntoPyObject<'py> for Entered {
    type Target = Guard;
    type Output = Bound<'py, Guard>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, Guard>> {
        let block = OpenBlock {
            lock: self.lock,
            held: self.held.clone(),
            outer: innermost_block(py)?,
        };
        set_innermost_block(py, Some(Py::new(py, block)?))?;
        Guard::made(self.held).into_pyobject(py)
    }
}

/// Closes the innermost block of `lock` open in the current context and
/// returns its hold (`None` when there is none).
fn close_block(py: Python<'_>, lock: u64) -> PyResult<Option<Arc<Held<locksmith::Guard>>>> {
    let mut inner = Vec::new();
    let mut next = innermost_block(py)?;
    while let Some(block) = next {
        let open = block.get();
        if open.lock == lock {
            // The blocks inside it (of other locks, exited out of order)
            // stay open, on what was outside it.
            let mut outer = open.outer.as_ref().map(|outer| outer.clone_ref(py));
            for kept in inner.into_iter().rev() {
                let kept: &OpenBlock = Py::<OpenBlock>::get(&kept);
                let block = OpenBlock {
                    lock: kept.lock,
                    held: kept.held.clone(),
                    outer,
                };
                outer = Some(Py::new(py, block)?);
            }
            set_innermost_block(py, outer)?;
            return Ok(Some(open.held.clone()));
        }
        next = open.outer.as_ref().map(|outer| outer.clone_ref(py));
        inner.push(block);
    }
    Ok(None)
}

/// A lock to acquire; `async with lock as guard:` acquires and releases.
#[pyclass(module = "locksmith.aio", extends = LockBase, frozen)]
pub struct Lock {
    /// Tells this lock's `async with` blocks from other locks' (unlike an
    /// address, never reused).
    id: u64,
}

impl Lock {
    pub fn new(base: LockBase) -> PyClassInitializer<Self> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        PyClassInitializer::from(base).add_subclass(Lock {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        })
    }
}

#[pymethods]
impl Lock {
    /// Acquires, waiting at most `wait` seconds (default: the lock's `wait`,
    /// else until granted); raises `Timeout` when the wait runs out.
    ///
    /// Cancel safety: safe; a cancelled acquire leaves no queue entry and no
    /// hold behind (one granted in that moment is given back).
    #[pyo3(signature = (wait=None))]
    fn acquire(slf: &Bound<'_, Self>, wait: Option<&Bound<'_, PyAny>>) -> PyResult<Awaitable> {
        let wait = convert::optional_duration(wait, "wait")?;
        let lock = slf.as_super().get().to_call()?;
        // The client's future is made inside the awaitable's, in its box
        // (see `awaitable_made`).
        Ok(awaitable_made(move || async move {
            Ok(Guard::made(shared::acquire(lock, wait).await?))
        }))
    }

    /// Acquires only if that is possible right now; `None` when busy.
    ///
    /// Cancel safety: as `acquire`.
    fn try_acquire(slf: &Bound<'_, Self>) -> PyResult<Awaitable> {
        let lock = slf.as_super().get().to_call()?;
        Ok(awaitable_made(move || async move {
            Ok(shared::try_acquire(lock).await?.map(Guard::made))
        }))
    }

    /// Acquires with the lock's own `wait`; the block is open in the
    /// context of the task that awaits this (see [`OpenBlock`]).
    ///
    /// Cancel safety: as `acquire`.
    fn __aenter__(slf: &Bound<'_, Self>) -> PyResult<Awaitable> {
        let id = slf.get().id;
        let lock = slf.as_super().get().to_call()?;
        Ok(awaitable_made(move || async move {
            let held = shared::acquire(lock, None).await?;
            Ok(Entered { lock: id, held })
        }))
    }

    /// Releases what the innermost open block of this lock in the current
    /// context (the same task's) acquired; nothing when there is none.
    ///
    /// Cancel safety: as `Guard.release`.
    fn __aexit__(
        slf: &Bound<'_, Self>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _traceback: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Awaitable> {
        let held = close_block(slf.py(), slf.get().id)?;
        exit(held, exc_type, |guard| guard.release())
    }
}

/// Ends a hold at the end of an `async with` block (`end` releases or
/// resigns): errors surface unless the block is already raising. A hold
/// lent to a call in flight (`extend`, `proclaim`) is ended once that call
/// returns; the hold is taken now, so that it ends even if the exit is
/// cancelled (see [`Held::take`]).
fn exit<T, F>(
    held: Option<Arc<Held<T>>>,
    exc_type: Option<&Bound<'_, PyAny>>,
    end: impl FnOnce(T) -> F + Send + 'static,
) -> PyResult<Awaitable>
where
    T: Send + 'static,
    F: std::future::Future<Output = locksmith::Result<()>> + Send + 'static,
{
    let raising = exc_type.is_some_and(|exc_type| !exc_type.is_none());
    let taken = match held {
        Some(held) if !held.is_released() => Some(held.take()?),
        _ => None,
    };
    // `end`'s future is made in the awaitable's box (see `awaitable_made`).
    Ok(awaitable_made(move || async move {
        if let Some(taken) = taken {
            let ended = match taken.hold().await {
                Ok(hold) => end(hold).await.py(),
                Err(error) => Err(error),
            };
            if !raising {
                ended?;
            }
        }
        Ok(false)
    }))
}

/// A read-write lock: many readers or one writer; writers are not starved
/// where the store queues waiters in order (not on Redis outside
/// `mode=fair`, nor over Redlock).
#[pyclass(module = "locksmith.aio", extends = RwLockBase, frozen)]
pub struct RwLock;

/// An awaitable of the hold's loss: its reason, or `None` once released.
fn lost_awaitable<T: Send>(held: &Held<T>) -> PyResult<Awaitable> {
    held.check()?;
    let lost = held.lost_or_released();
    Ok(awaitable(async move { Ok(lost.await) }))
}

/// A loss as the task of `on_lost` takes it: `(callback, cause, reason)`,
/// or `None` once the object that kept the callback is gone.
struct Loss {
    callback: Registered,
    cause: LostCause,
    reason: String,
}

impl<'py> IntoPyObject<'py> for Loss {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match self.callback.take(py) {
            Some(callback) => {
                (callback, errors::lost_cause(py, self.cause)?, self.reason).into_bound_py_any(py)
            }
            None => Ok(py.None().into_bound(py)),
        }
    }
}

/// `on_lost` for the running event loop: `callbacks` (those of the Python
/// object that owns the hold) keep `callback`, and a task of that loop
/// awaits the loss (woken like any awaitable, through the loop's waker, with
/// no thread taking the GIL for it) and calls `callback` in its done
/// callback; a release ends it without a call. The task has only a weak
/// reference to the callback (see [`LossCallbacks`]): a guard collected
/// takes its callbacks with it, and ends the task as a release does.
fn on_lost_on_loop<T: Send>(
    py: Python<'_>,
    held: &Held<T>,
    callbacks: &LossCallbacks,
    callback: Py<PyAny>,
) -> PyResult<()> {
    held.check()?;
    let call_on_loss = py
        .import(intern!(py, "locksmith.aio"))?
        .getattr(intern!(py, "_call_on_loss"))?;
    let callback = callbacks.add(callback);
    let lost = held.lost().clone();
    let ended = held.lost_or_released();
    let loss = awaitable(async move {
        Ok(ended.await.map(|reason| Loss {
            callback,
            cause: lost.cause().unwrap_or_default(),
            reason,
        }))
    });
    call_on_loss.call1((loss,))?;
    Ok(())
}

/// A held lock (or several, for a multi-lock).
#[pyclass(module = "locksmith.aio", extends = GuardBase, frozen)]
pub struct Guard {
    /// Its `on_lost` callbacks, kept here for the garbage collector to see.
    callbacks: LossCallbacks,
}

impl Guard {
    fn made(held: Arc<Held<locksmith::Guard>>) -> Made<Self> {
        Made(GuardBase::new(held).add_subclass(Guard {
            callbacks: LossCallbacks::default(),
        }))
    }
}

fn guard_held(slf: &Bound<'_, Guard>) -> Arc<Held<locksmith::Guard>> {
    slf.as_super().get().held.clone()
}

#[pymethods]
impl Guard {
    /// Completes with the reason once the hold is lost (`None` once it is
    /// released first).
    ///
    /// Cancel safety: safe; it only waits.
    fn lost(slf: &Bound<'_, Self>) -> PyResult<Awaitable> {
        lost_awaitable(&guard_held(slf))
    }

    /// Calls `callback(cause, reason)` on the running event loop when the
    /// hold is lost (at once if it was); not after a release. The guard
    /// keeps the callback: a guard collected takes its callbacks with it,
    /// even one in a reference cycle with them (and is released in the
    /// background, as any guard dropped while held).
    fn on_lost(slf: &Bound<'_, Self>, callback: Py<PyAny>) -> PyResult<()> {
        let callbacks = &slf.get().callbacks;
        on_lost_on_loop(slf.py(), &guard_held(slf), callbacks, callback)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.callbacks.traverse(&visit)
    }

    fn __clear__(&self) {
        self.callbacks.clear();
    }

    /// Extends a leased hold to `lease` seconds from now. A `release` (or
    /// the exit of `async with`) meanwhile waits for this to return.
    ///
    /// Cancel safety: safe; the hold stays, extended or not (unless
    /// released meanwhile).
    fn extend(slf: &Bound<'_, Self>, lease: &Bound<'_, PyAny>) -> PyResult<Awaitable> {
        let lease = convert::duration(lease, "lease")?;
        let held = guard_held(slf);
        Ok(awaitable(
            async move { held.lend()?.extend(lease).await.py() },
        ))
    }

    /// Releases the hold; raises if it was lost or already released.
    /// While an `extend` is in flight, waits for it to return, then
    /// releases.
    ///
    /// Cancel safety: the hold ends either way; a cancelled release goes on
    /// in the background, unchecked (once the `extend` returns).
    fn release(slf: &Bound<'_, Self>) -> Awaitable {
        let held = guard_held(slf);
        awaitable_made(move || async move { held.take()?.hold().await?.release().await.py() })
    }

    fn __aenter__(slf: Py<Self>) -> Awaitable {
        awaitable(async move { Ok(slf) })
    }

    /// Releases the hold unless it was already (as `release`).
    fn __aexit__(
        slf: &Bound<'_, Self>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _traceback: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Awaitable> {
        exit(Some(guard_held(slf)), exc_type, |guard| guard.release())
    }
}

/// An election on one lock name.
#[pyclass(module = "locksmith.aio", extends = ElectionBase, frozen)]
pub struct Election;

#[pymethods]
impl Election {
    /// Waits until this candidate leads, publishing `value`; raises
    /// `Timeout` after `wait` seconds if given.
    ///
    /// Cancel safety: safe, as `Lock.acquire`: a cancelled campaign leaves no
    /// candidacy behind.
    #[pyo3(signature = (value, *, wait=None))]
    fn campaign(
        slf: &Bound<'_, Self>,
        value: String,
        wait: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Awaitable> {
        let wait = convert::optional_duration(wait, "wait")?;
        let campaigning = slf.as_super().get().campaigning(value, wait)?;
        Ok(awaitable(async move {
            let leadership = LeadershipBase::new(campaigning.await?);
            Ok(Made(leadership.add_subclass(Leadership {
                callbacks: LossCallbacks::default(),
            })))
        }))
    }

    /// The current leader, or `None`.
    ///
    /// Cancel safety: safe, read-only.
    fn leader(slf: &Bound<'_, Self>) -> PyResult<Awaitable> {
        let base = slf.as_super().get();
        base.connection.client()?;
        let election = base.inner.clone();
        Ok(awaitable(async move {
            Ok(Inspected::Leader(election.leader().await.py()?))
        }))
    }

    /// An async iterator over the leader now and every change (`None`:
    /// nobody leads).
    fn observe(slf: &Bound<'_, Self>) -> PyResult<Observer> {
        let base = slf.as_super().get();
        base.connection.client()?;
        Ok(Observer {
            connection: base.connection.clone(),
            stream: std::mem::ManuallyDrop::new(Arc::new(tokio::sync::Mutex::new(
                base.inner.observe().boxed(),
            ))),
        })
    }
}

/// This candidate's leadership until resigned, dropped or lost.
#[pyclass(module = "locksmith.aio", extends = LeadershipBase, frozen)]
pub struct Leadership {
    /// Its `on_lost` callbacks, kept here for the garbage collector to see.
    callbacks: LossCallbacks,
}

fn leadership_held(slf: &Bound<'_, Leadership>) -> Arc<Held<locksmith::Leadership>> {
    slf.as_super().get().held.clone()
}

#[pymethods]
impl Leadership {
    /// Completes with the reason once leadership is lost (`None` once it
    /// is resigned first).
    ///
    /// Cancel safety: safe; it only waits.
    fn lost(slf: &Bound<'_, Self>) -> PyResult<Awaitable> {
        lost_awaitable(&leadership_held(slf))
    }

    /// Calls `callback(cause, reason)` on the running event loop when
    /// leadership is lost (at once if it was); not after a resign. The
    /// leadership keeps the callback (as `Guard.on_lost`).
    fn on_lost(slf: &Bound<'_, Self>, callback: Py<PyAny>) -> PyResult<()> {
        let callbacks = &slf.get().callbacks;
        on_lost_on_loop(slf.py(), &leadership_held(slf), callbacks, callback)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.callbacks.traverse(&visit)
    }

    fn __clear__(&self) {
        self.callbacks.clear();
    }

    /// Publishes a new value while leading (memory, etcd and ZooKeeper).
    /// A `resign` (or the exit of `async with`) meanwhile waits for this
    /// to return.
    ///
    /// Cancel safety: safe; the leadership stays (unless resigned
    /// meanwhile), and the new value may or may not be published (`value`
    /// still says the old one).
    fn proclaim(slf: &Bound<'_, Self>, value: String) -> Awaitable {
        let held = leadership_held(slf);
        let published = slf.as_super().get().value.clone();
        awaitable(async move {
            held.lend()?.proclaim(value.clone()).await.py()?;
            *published.lock().unwrap_or_else(|e| e.into_inner()) = value;
            Ok(())
        })
    }

    /// Steps down: the next candidate leads. While a `proclaim` is in
    /// flight, waits for it to return, then resigns.
    ///
    /// Cancel safety: the leadership ends either way; a cancelled resign
    /// goes on in the background, unchecked (once the `proclaim` returns).
    fn resign(slf: &Bound<'_, Self>) -> Awaitable {
        let held = leadership_held(slf);
        awaitable(async move { held.take()?.hold().await?.resign().await.py() })
    }

    fn __aenter__(slf: Py<Self>) -> Awaitable {
        awaitable(async move { Ok(slf) })
    }

    /// Resigns unless it was already (as `resign`).
    fn __aexit__(
        slf: &Bound<'_, Self>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _traceback: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Awaitable> {
        exit(Some(leadership_held(slf)), exc_type, |leadership| {
            leadership.resign()
        })
    }
}

/// The leader now and at every change, as an async iterator. A failed read
/// raises, and the next `__anext__` carries on.
#[pyclass(module = "locksmith.aio", frozen)]
pub struct Observer {
    connection: Arc<Connection>,
    /// Shared with the `__anext__` calls running; dropped by [`Drop`].
    stream: std::mem::ManuallyDrop<Arc<tokio::sync::Mutex<LeaderStream>>>,
}

impl Drop for Observer {
    /// The stream is dropped in the runtime's context, as its client is; in
    /// a forked child it is forgotten: it belongs to the parent's runtime,
    /// and dropping it may take a lock of the parent's connection (or
    /// `memory://` table) that a thread of the parent held at the fork, for
    /// ever in the child.
    fn drop(&mut self) {
        // SAFETY: taken once, here; the field is never used again.
        let stream = unsafe { std::mem::ManuallyDrop::take(&mut self.stream) };
        if self.connection.generation() == crate::runtime::generation() {
            let _entered = crate::runtime::runtime().enter();
            drop(stream);
        } else {
            std::mem::forget(stream);
        }
    }
}

#[pymethods]
impl Observer {
    fn __aiter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// The next leader.
    ///
    /// Cancel safety: safe; a cancelled wait loses no change.
    fn __anext__(&self) -> PyResult<Awaitable> {
        self.connection.client()?;
        // The `Arc`, not a `ManuallyDrop` of it: the call drops its share.
        let stream = Arc::clone(&self.stream);
        Ok(awaitable(async move {
            let next = stream.lock().await.next().await;
            match next {
                Some(leader) => Ok(Inspected::Leader(leader.py()?)),
                None => Err(pyo3::exceptions::PyStopAsyncIteration::new_err(())),
            }
        }))
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
    crate::awaitable::register(module)?;
    Ok(())
}
