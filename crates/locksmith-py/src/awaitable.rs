//! The awaitable every method of the asyncio API returns: a Rust future
//! driven by the asyncio task that awaits it.
//!
//! The task polls the future itself, on the event loop's thread and inside
//! the runtime's context, each time it steps. A future that is ready at once
//! (every call on `memory://`, a release, a cached answer) completes in that
//! first step: no task spawned, no thread crossed, no waker made, nothing
//! made for the loop. A future that is pending gives the task a [`Wakeup`] of the running
//! loop to wait on; the Rust waker has the loop fire it, once, through the
//! loop's [`LoopWaker`] (without the GIL, from whatever thread it fires on),
//! and the task steps again and polls again. All Python code (converting
//! the result, raising its exception) runs in the awaiting task, with its
//! loop and context.
//!
//! Cancelling the awaiting task throws `CancelledError` into the awaitable,
//! which drops the Rust future there and then; so do closing it and
//! dropping it unawaited. Every future handed here is cancel-safe (each
//! method documents what a cancel leaves), so a cancelled acquire leaves
//! nothing behind. Like a coroutine, an awaitable does nothing until
//! awaited, and can be awaited once.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};

use pyo3::exceptions::{PyBaseException, PyRuntimeError, PyStopIteration};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyTuple, PyType};
use pyo3::{ffi, IntoPyObjectExt};

use crate::loop_waker::{LoopWaker, Wakeup};
use crate::runtime;

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
    T: for<'py> IntoPyObject<'py>,
{
    fn step(
        self: Pin<&mut Self>,
        py: Python<'_>,
        cx: &mut Context<'_>,
    ) -> Poll<PyResult<Py<PyAny>>> {
        self.poll(cx)
            .map(|output| output.and_then(|value| value.into_py_any(py)))
    }
}

/// An awaitable for `future`; see the module's docs.
pub fn awaitable<F, T>(future: F) -> Awaitable
where
    F: Future<Output = PyResult<T>> + Send + 'static,
    T: for<'py> IntoPyObject<'py> + 'static,
{
    Awaitable {
        generation: runtime::generation(),
        state: Mutex::new(State {
            future: Some(Box::pin(future)),
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
    future: Option<Pin<Box<dyn Step>>>,
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
    /// Polls the future, inside the runtime's context: first with a waker
    /// that does nothing, which is all a future that is ready at once (most
    /// calls on `memory://`, every release) needs; only if it is pending,
    /// again with a waker of its own, which the future keeps (a future
    /// heeds the waker of its latest poll, and that poll sees whatever
    /// happened since the first).
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
        let entered = runtime::runtime().enter();
        let mut noop = Context::from_waker(Waker::noop());
        if let Poll::Ready(output) = future.as_mut().step(py, &mut noop) {
            drop(future);
            drop(entered);
            return output.map(Stepped::Returned);
        }
        let wake = Arc::new(PollWake::default());
        let waker = Waker::from(wake.clone());
        match future.as_mut().step(py, &mut Context::from_waker(&waker)) {
            Poll::Ready(output) => {
                drop(future);
                drop(entered);
                output.map(Stepped::Returned)
            }
            Poll::Pending => {
                drop(entered);
                let mut state = self.state();
                state.future = Some(future);
                state.waiting = Some(wake.clone());
                drop(state);
                wake.wait_on(py).map(Stepped::Waiting)
            }
        }
    }
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

    /// After a pending poll: the wakeup for the task to wait on (as
    /// `await` yields an asyncio future), or `None` if already woken (a bare
    /// yield: the task steps again at once).
    fn wait_on(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        static GET_RUNNING_LOOP: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
        let get_running_loop = GET_RUNNING_LOOP.import(py, "asyncio", "get_running_loop")?;
        let event_loop = get_running_loop.call0()?;
        let waker = LoopWaker::of(&event_loop)?;
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
            Target::Waiting { waker, wakeup } => {
                drop(target);
                waker.wake_soon(wakeup);
            }
            Target::Done => {}
        }
    }
}
