//! The awaitable every method of the asyncio API returns: a Rust future
//! driven by the asyncio task that awaits it.
//!
//! The task polls the future itself, on the event loop's thread and inside
//! the runtime's context, each time it steps. A future that is ready at once
//! (every call on `memory://`, a release, a cached answer) completes in that
//! first step: no task spawned, no thread crossed, no asyncio future made.
//! A future that is pending gets an asyncio future of the running loop to
//! wait on; the Rust waker has the loop resolve it, once, through the
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
use pyo3::{intern, IntoPyObjectExt};

use crate::loop_waker::LoopWaker;
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

    /// One step of the awaiting task: an asyncio future to wait on, `None`
    /// to be stepped again at once, or the end with the result (see
    /// [`returned`]).
    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        runtime::check_generation(self.generation)?;
        // Out of its slot while polled: converting the output may run
        // Python code, and nothing is held across that.
        let Some(mut future) = self.state().future.take() else {
            return Err(PyRuntimeError::new_err(
                "cannot reuse an awaitable that was already awaited",
            ));
        };
        let wake = Arc::new(PollWake::default());
        let waker = Waker::from(wake.clone());
        let entered = runtime::runtime().enter();
        match future.as_mut().step(py, &mut Context::from_waker(&waker)) {
            Poll::Ready(output) => {
                drop(future);
                drop(entered);
                if let Some(waited) = self.state().waiting.take() {
                    waited.forget();
                }
                returned(output?.into_bound(py))
            }
            Poll::Pending => {
                drop(entered);
                let mut state = self.state();
                state.future = Some(future);
                let earlier = state.waiting.replace(wake.clone());
                drop(state);
                if let Some(earlier) = earlier {
                    earlier.forget();
                }
                wake.wait_on(py).map(Some)
            }
        }
    }

    /// Steps on; a value sent in is ignored (asyncio sends none). Unlike
    /// `__next__`, a method must raise `StopIteration` to return `None`.
    fn send(&self, py: Python<'_>, _value: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.__next__(py)?
            .ok_or_else(|| PyStopIteration::new_err(()))
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

/// How `__next__` returns `value` to the awaiting coroutine, as cheaply as
/// Python allows: `None` by ending the iteration with no exception set, any
/// other value in a `StopIteration` whose instance Python makes only if it
/// must (a tuple or an exception is wrapped, as Python's own generators do,
/// lest it be taken for the exception's arguments).
fn returned(value: Bound<'_, PyAny>) -> PyResult<Option<Py<PyAny>>> {
    let py = value.py();
    if value.is_none() {
        return Ok(None);
    }
    let stop = py.get_type::<PyStopIteration>();
    Err(
        if value.is_instance_of::<PyTuple>() || value.is_instance_of::<PyBaseException>() {
            PyErr::from_type(stop, (value.unbind(),))
        } else {
            PyErr::from_type(stop, value.unbind())
        },
    )
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
    /// The asyncio future the task waits on, and its loop's waker.
    Waiting {
        waker: Arc<LoopWaker>,
        future: Py<PyAny>,
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

    /// After a pending poll: the asyncio future for the task to wait on
    /// (as `await` yields it), or `None` if already woken (a bare yield: the
    /// task steps again at once).
    fn wait_on(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        static GET_RUNNING_LOOP: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
        let get_running_loop = GET_RUNNING_LOOP.import(py, "asyncio", "get_running_loop")?;
        let event_loop = get_running_loop.call0()?;
        let waker = LoopWaker::of(&event_loop)?;
        let future = event_loop.call_method0(intern!(py, "create_future"))?;
        // What `asyncio.Future.__await__` sets before yielding itself: the
        // task then waits for it.
        future.setattr(intern!(py, "_asyncio_future_blocking"), true)?;
        let mut target = self.target();
        if matches!(*target, Target::Woken) {
            *target = Target::Done;
            return Ok(py.None());
        }
        *target = Target::Waiting {
            waker,
            future: future.clone().unbind(),
        };
        Ok(future.unbind())
    }

    /// Forgets the asyncio future: the awaitable has finished.
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
            Target::Waiting { waker, future } => {
                drop(target);
                waker.resolve_soon(future);
            }
            Target::Done => {}
        }
    }
}
