//! The awaitable every method of the asyncio API returns: a Rust future
//! driven by the asyncio task that awaits it.
//!
//! The task polls the future itself, on the event loop's thread and inside
//! the runtime's context, each time it steps. A future that is ready at once
//! (every call on `memory://`, a release, a cached answer) completes in that
//! first step: no task spawned, no thread crossed, no waker made, nothing
//! made for the loop. A future that is pending is waited for in one of two
//! ways. If the loop has nothing else to do (no callback ready, no timer
//! due; asyncio's own selector loop on Linux), the step waits in the
//! loop's place, on the loop's own descriptors with the GIL released, as
//! its `select` would: a wake of the call ends the wait and the step polls
//! again, without a turn of the loop; anything else the loop watches ends
//! it too, and the task then waits through the loop. There, the task waits
//! on a [`Wakeup`] of the running loop; the Rust waker has the loop fire
//! it, once, through the loop's [`LoopWaker`] (without the GIL, from
//! whatever thread it fires on), and the task steps again and polls again.
//! All Python code (converting
//! the result, raising its exception) runs in the awaiting task, with its
//! loop and context.
//!
//! Cancelling the awaiting task throws `CancelledError` into the awaitable,
//! which drops the Rust future there and then; so do closing it and
//! dropping it unawaited. Every future handed here is cancel-safe (each
//! method documents what a cancel leaves), so a cancelled acquire leaves
//! nothing behind. Like a coroutine, an awaitable does nothing until
//! awaited, and can be awaited once.

use std::any::TypeId;
use std::future::Future;
use std::mem::ManuallyDrop;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll, RawWaker, RawWakerVTable, Wake, Waker};

use pyo3::exceptions::{PyBaseException, PyRuntimeError, PyStopIteration};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyTuple, PyType};
use pyo3::{ffi, IntoPyObjectExt};

use crate::loop_waker::{LoopWaker, Wakeup};
use crate::runtime;
use crate::spare::SpareBox;

/// A future whose output becomes a Python object when it is ready.
trait Step: Send {
    fn step(
        self: Pin<&mut Self>,
        py: Python<'_>,
        cx: &mut Context<'_>,
    ) -> Poll<PyResult<Py<PyAny>>>;
}

impl<F, T> Step for F
where
    F: Future<Output = PyResult<T>> + Send,
    T: for<'py> IntoPyObject<'py> + 'static,
{
    fn step(
        self: Pin<&mut Self>,
        py: Python<'_>,
        cx: &mut Context<'_>,
    ) -> Poll<PyResult<Py<PyAny>>> {
        self.poll(cx).map(|output| {
            output.and_then(|value| {
                // PyO3 makes `()` an empty tuple; a call without a value
                // returns `None`, as a Python function does.
                if TypeId::of::<T>() == TypeId::of::<()>() {
                    Ok(py.None())
                } else {
                    value.into_py_any(py)
                }
            })
        })
    }
}

/// An awaitable for `future`; see the module's docs.
#[inline(always)]
pub fn awaitable<F, T>(future: F) -> Awaitable
where
    F: Future<Output = PyResult<T>> + Send + 'static,
    T: for<'py> IntoPyObject<'py> + 'static,
{
    awaitable_made(move || future)
}

/// An awaitable for the future `make` makes, once there is room for it.
///
/// A client call's future is kilobytes, and each move of it a copy of
/// them all. Made here (`awaitable_made(move || async move {
/// client_call(..).await })`) it is written straight into its box (this is
/// inlined for that). A future made before is copied on every move on its
/// way into its box (given to [`awaitable`], at least once), and once more
/// on its first poll if another future awaits it.
#[inline(always)]
pub fn awaitable_made<M, F, T>(make: M) -> Awaitable
where
    M: FnOnce() -> F,
    F: Future<Output = PyResult<T>> + Send + 'static,
    T: for<'py> IntoPyObject<'py> + 'static,
{
    // SAFETY: the closure returns its argument, unsized.
    let future = unsafe { SpareBox::<dyn Step>::pin(make, |future| future) };
    Awaitable {
        generation: runtime::generation(),
        state: Mutex::new(State {
            future: Some(future),
            waiting: None,
        }),
    }
}

/// An awaitable over a Rust future (`locksmith.aio` methods return it).
#[pyclass(module = "locksmith.aio", frozen)]
pub struct Awaitable {
    /// The fork generation the future belongs to.
    generation: u64,
    state: Mutex<State>,
}

struct State {
    /// `None` once completed, failed, cancelled or closed.
    future: Option<Pin<SpareBox<dyn Step>>>,
    /// The waker of the last poll that was pending.
    waiting: Option<Arc<PollWake>>,
}

impl Awaitable {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drops the future in the runtime's context (its drop may hand a
    /// cleanup to the runtime; a forked child forgets it instead), and the
    /// asyncio future it had the task wait on.
    fn finish(&self) {
        let (future, waiting) = {
            let mut state = self.state();
            (state.future.take(), state.waiting.take())
        };
        drop_in_runtime(self.generation, future);
        if let Some(waiting) = waiting {
            waiting.forget();
        }
    }
}

fn drop_in_runtime<T>(generation: u64, value: Option<T>) {
    if value.is_none() {
        return;
    }
    if generation == runtime::generation() {
        let _entered = runtime::runtime().enter();
        drop(value);
    } else {
        std::mem::forget(value);
    }
}

#[pymethods]
impl Awaitable {
    fn __await__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// One step of the awaiting task: a [`Wakeup`] to wait on, `None` to
    /// be stepped again at once, or the end with the result, returned as
    /// cheaply as Python allows: `None` by ending the iteration with no
    /// exception set (`tp_iternext`'s own convention), any other value by
    /// setting `StopIteration` with the value itself, which Python up to
    /// 3.11 hands to the awaiting coroutine without making the exception.
    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        match self.step(py)? {
            Stepped::Waiting(wait_on) => Ok(Some(wait_on)),
            Stepped::Returned(value) => {
                if !value.is_none(py) {
                    let argument = stop_iteration_argument(value.into_bound(py))?;
                    // SAFETY: the GIL is held; both objects are valid, and
                    // `PyErr_SetObject` takes its own references. Returning
                    // NULL (`None` here) with the error set is how a
                    // `tp_iternext` returns an exception.
                    unsafe { ffi::PyErr_SetObject(ffi::PyExc_StopIteration, argument.as_ptr()) };
                }
                Ok(None)
            }
        }
    }

    /// Steps on; a value sent in is ignored (asyncio sends none). Unlike
    /// `__next__`, a method must raise `StopIteration` to return.
    fn send(&self, py: Python<'_>, _value: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        match self.step(py)? {
            Stepped::Waiting(wait_on) => Ok(wait_on),
            Stepped::Returned(value) => Err(PyStopIteration::new_err(
                stop_iteration_argument(value.into_bound(py))?.unbind(),
            )),
        }
    }

    /// Drops the future and raises `error` (asyncio throws `CancelledError`
    /// in when the awaiting task is cancelled).
    #[pyo3(signature = (error, value=None, _traceback=None))]
    fn throw(
        &self,
        error: &Bound<'_, PyAny>,
        value: Option<&Bound<'_, PyAny>>,
        _traceback: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        self.finish();
        let error = match value {
            Some(value) if !value.is_none() => PyErr::from_value(value.clone()),
            _ => match error.cast::<PyType>() {
                Ok(class) => PyErr::from_type(class.clone(), ()),
                Err(_) => PyErr::from_value(error.clone()),
            },
        };
        Err(error)
    }

    /// Drops the future without awaiting it.
    fn close(&self) {
        self.finish();
    }
}

/// What one step of the awaiting task ends with.
enum Stepped {
    /// The task waits on this (a [`Wakeup`], or `None` to step again at once).
    Waiting(Py<PyAny>),
    /// The future completed with this value.
    Returned(Py<PyAny>),
}

impl Awaitable {
    /// Polls the future once, inside the runtime's context, with a
    /// [`LazyWake`]: a future that is ready at once (most calls on
    /// `memory://`, every release) never keeps its waker, and nothing is
    /// made for it; one that is pending keeps a clone, the [`PollWake`] its
    /// task waits on.
    fn step(&self, py: Python<'_>) -> PyResult<Stepped> {
        runtime::check_generation(self.generation)?;
        // Out of its slot while polled: converting the output may run
        // Python code, and nothing is held across that. The earlier poll's
        // waker is forgotten: this poll sees what it would have woken for.
        let (future, earlier) = {
            let mut state = self.state();
            (state.future.take(), state.waiting.take())
        };
        if let Some(earlier) = earlier {
            earlier.forget();
        }
        let Some(mut future) = future else {
            return Err(PyRuntimeError::new_err(
                "cannot reuse an awaitable that was already awaited",
            ));
        };
        loop {
            let entered = runtime::runtime().enter();
            let lazy = LazyWake::default();
            let polled = {
                let waker = lazy.waker();
                future.as_mut().step(py, &mut Context::from_waker(&waker))
            };
            if let Poll::Ready(output) = polled {
                drop(future);
                drop(entered);
                return output.map(Stepped::Returned);
            }
            drop(entered);
            // A future that kept no waker never wakes the task; it still
            // gets a wakeup to wait on, which a cancel ends.
            let wake = lazy.made.into_inner().unwrap_or_default();
            let event_loop = running_loop(py)?;
            let waker = LoopWaker::of(&event_loop)?;
            if woken_in_place(&waker, &event_loop, &wake)? {
                continue;
            }
            let mut state = self.state();
            state.future = Some(future);
            state.waiting = Some(wake.clone());
            drop(state);
            return wake.wait_on(py, event_loop, waker).map(Stepped::Waiting);
        }
    }
}

/// Whether the pending call was woken while its step waited in the loop's
/// place, as the loop's own `select` would wait, when the loop has nothing
/// else to do ([`LoopWaker::idle_for`]). A call woken there goes on in the
/// same step, without a turn of the loop; anything else the loop watches
/// ends the wait, and the task waits through the loop as usual.
fn woken_in_place(
    waker: &Arc<LoopWaker>,
    event_loop: &Bound<'_, PyAny>,
    wake: &PollWake,
) -> PyResult<bool> {
    let Some(timeout) = waker.idle_for(event_loop)? else {
        return Ok(false);
    };
    if !wake.wait_here(waker) {
        return Ok(true);
    }
    waker.wait(event_loop.py(), timeout);
    if wake.woken_here() {
        waker.took_raise();
        Ok(true)
    } else {
        Ok(false)
    }
}

/// The event loop running on this thread (`asyncio.get_running_loop()`).
fn running_loop(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    static GET_RUNNING_LOOP: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    GET_RUNNING_LOOP
        .import(py, "asyncio", "get_running_loop")?
        .call0()
}

/// The waker of one poll, whose [`PollWake`] is made only when the future
/// keeps the waker (clones it) or wakes it during the poll. std offers a
/// waker made up front (`Waker::from`) or one that does nothing
/// (`Waker::noop`), not one made on first use, hence this.
#[derive(Default)]
struct LazyWake {
    made: OnceLock<Arc<PollWake>>,
}

impl LazyWake {
    fn get(&self) -> &Arc<PollWake> {
        self.made.get_or_init(Arc::default)
    }

    /// A waker that borrows `self`: the poll it is lent to must end before
    /// `self` does (a future keeps a clone, which is a [`PollWake`]'s own).
    fn waker(&self) -> Waker {
        const VTABLE: RawWakerVTable = RawWakerVTable::new(
            LazyWake::clone_raw,
            LazyWake::wake_raw,
            LazyWake::wake_raw,
            LazyWake::drop_raw,
        );
        // SAFETY: the vtable's functions take `data` as `&LazyWake`, which
        // is `Sync` (a `OnceLock`), and lives as long as the borrowed waker:
        // dropping it does nothing, and its clones own an `Arc` instead.
        unsafe { Waker::new(std::ptr::from_ref(self).cast(), &VTABLE) }
    }

    /// A waker of the [`PollWake`], made now if not yet.
    unsafe fn clone_raw(data: *const ()) -> RawWaker {
        // SAFETY: `data` is the `LazyWake` of `waker`, alive during the poll.
        let lazy = unsafe { &*data.cast::<LazyWake>() };
        let waker = ManuallyDrop::new(Waker::from(lazy.get().clone()));
        RawWaker::new(waker.data(), waker.vtable())
    }

    /// Woken during the poll: the task steps again at once.
    unsafe fn wake_raw(data: *const ()) {
        // SAFETY: as in `clone_raw`.
        let lazy = unsafe { &*data.cast::<LazyWake>() };
        lazy.get().wake_by_ref();
    }

    unsafe fn drop_raw(_data: *const ()) {}
}

/// What `StopIteration` carries to return `value`: the value itself, or a
/// tuple or an exception wrapped in a tuple (as Python's own generators do),
/// lest it be taken for the exception's arguments or the exception.
fn stop_iteration_argument(value: Bound<'_, PyAny>) -> PyResult<Bound<'_, PyAny>> {
    if value.is_instance_of::<PyTuple>() || value.is_instance_of::<PyBaseException>() {
        PyTuple::new(value.py(), [value]).map(Bound::into_any)
    } else {
        Ok(value)
    }
}

impl Drop for Awaitable {
    fn drop(&mut self) {
        self.finish();
    }
}

/// What one poll's waker has to wake.
#[derive(Default)]
enum Target {
    /// The poll has not returned yet.
    #[default]
    Polling,
    /// Woken before the poll returned: step again at once.
    Woken,
    /// The step waits for the wake itself, in the loop's place
    /// ([`woken_in_place`]): raise the loop's signal.
    Here { waker: Arc<LoopWaker> },
    /// The wakeup the task waits on, and its loop's waker.
    Waiting {
        waker: Arc<LoopWaker>,
        wakeup: Py<Wakeup>,
    },
    /// Woken, or the awaitable finished: nothing more to do.
    Done,
}

/// The waker of one poll.
#[derive(Default)]
struct PollWake {
    target: Mutex<Target>,
}

impl PollWake {
    fn target(&self) -> MutexGuard<'_, Target> {
        self.target.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// After a pending poll: the wakeup of `event_loop` (whose waker is
    /// `waker`) for the task to wait on (as `await` yields an asyncio
    /// future), or `None` if already woken (a bare yield: the task steps
    /// again at once).
    fn wait_on(
        &self,
        py: Python<'_>,
        event_loop: Bound<'_, PyAny>,
        waker: Arc<LoopWaker>,
    ) -> PyResult<Py<PyAny>> {
        let wakeup = Py::new(py, Wakeup::new(event_loop.unbind()))?;
        let mut target = self.target();
        if matches!(*target, Target::Woken) {
            *target = Target::Done;
            return Ok(py.None());
        }
        *target = Target::Waiting {
            waker,
            wakeup: wakeup.clone_ref(py),
        };
        Ok(wakeup.into_any())
    }

    /// Before the step waits in the loop's place: a wake from now on
    /// raises `waker`'s signal, the loop's own, instead of queuing a
    /// wakeup. `false` if it was woken already.
    fn wait_here(&self, waker: &Arc<LoopWaker>) -> bool {
        let mut target = self.target();
        if matches!(*target, Target::Woken) {
            return false;
        }
        *target = Target::Here {
            waker: waker.clone(),
        };
        true
    }

    /// After waiting in the loop's place: whether the call was woken
    /// meanwhile. If not, a wake from now on is for [`PollWake::wait_on`].
    fn woken_here(&self) -> bool {
        let mut target = self.target();
        if matches!(*target, Target::Woken) {
            true
        } else {
            *target = Target::Polling;
            false
        }
    }

    /// Forgets the wakeup: the awaitable has finished.
    fn forget(&self) {
        let finished = std::mem::replace(&mut *self.target(), Target::Done);
        drop(finished);
    }
}

impl Wake for PollWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let mut target = self.target();
        match std::mem::replace(&mut *target, Target::Done) {
            Target::Polling | Target::Woken => *target = Target::Woken,
            Target::Here { waker } => {
                *target = Target::Woken;
                drop(target);
                waker.raise();
            }
            Target::Waiting { waker, wakeup } => {
                drop(target);
                waker.wake_soon(wakeup);
            }
            Target::Done => {}
        }
    }
}
