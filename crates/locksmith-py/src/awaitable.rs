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
use std::ffi::{c_int, c_uint, c_void};
use std::future::Future;
use std::mem::ManuallyDrop;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll, RawWaker, RawWakerVTable, Wake, Waker};

use pyo3::exceptions::{PyBaseException, PyRuntimeError, PyStopIteration, PyTypeError};
use pyo3::panic::PanicException;
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

/// An awaitable over a Rust future (`locksmith.aio` methods return it; its
/// Python type is made by hand, see [`TYPE`]).
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

/// An awaitable as CPython sees it: the object's header, then the value.
#[repr(C)]
struct Object {
    header: ffi::PyObject,
    awaitable: Awaitable,
}

/// The Python type `locksmith.aio.Awaitable`, made by [`register`].
///
/// Written against CPython's stable ABI by hand, not with `#[pyclass]`:
/// PyO3 offers neither of the two cheap slots an awaitable can have.
/// `am_send` lets `await` take the result without a `StopIteration` raised
/// and caught, and a slot of its own enters no trampoline (PyO3's keeps a
/// thread-local count, a reference pool and a panic guard on every call).
/// With the object made directly instead of through `object.__new__`,
/// that took 1 450 of the 5 800 instructions Python added to an asyncio
/// pair on `memory://` (callgrind; docs/BENCHMARKS.md, "The awaitable's
/// own type").
static TYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// Adds `Awaitable` to the `aio` module, making its type on first use.
pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add("Awaitable", awaitable_type(module.py())?)
}

fn awaitable_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    TYPE.get_or_try_init(py, || make_type(py))
        .map(|made| made.bind(py))
}

fn make_type(py: Python<'_>) -> PyResult<Py<PyType>> {
    // CPython keeps a pointer to the method table, so it lives as long as
    // the process (this runs once).
    let methods: &'static mut [ffi::PyMethodDef; 4] = Box::leak(Box::new([
        ffi::PyMethodDef {
            ml_name: c"send".as_ptr(),
            ml_meth: ffi::PyMethodDefPointer { PyCFunction: send },
            ml_flags: ffi::METH_O,
            ml_doc: c"Steps on; a value sent in is ignored (asyncio sends none).".as_ptr(),
        },
        ffi::PyMethodDef {
            ml_name: c"throw".as_ptr(),
            ml_meth: ffi::PyMethodDefPointer { PyCFunction: throw },
            ml_flags: ffi::METH_VARARGS,
            ml_doc: c"Drops the future and raises the error (asyncio throws CancelledError in when the awaiting task is cancelled).".as_ptr(),
        },
        ffi::PyMethodDef {
            ml_name: c"close".as_ptr(),
            ml_meth: ffi::PyMethodDefPointer { PyCFunction: close },
            ml_flags: ffi::METH_NOARGS,
            ml_doc: c"Drops the future without awaiting it.".as_ptr(),
        },
        ffi::PyMethodDef::zeroed(),
    ]));
    let mut slots = [
        slot(
            ffi::Py_tp_doc,
            c"An awaitable over a Rust future (the locksmith.aio methods return it)."
                .as_ptr()
                .cast_mut()
                .cast(),
        ),
        slot(ffi::Py_tp_dealloc, dealloc as *mut c_void),
        slot(ffi::Py_tp_free, ffi::PyObject_Free as *mut c_void),
        slot(ffi::Py_tp_iternext, next as *mut c_void),
        slot(ffi::Py_tp_methods, methods.as_mut_ptr().cast()),
        slot(ffi::Py_am_await, await_self as *mut c_void),
        slot(ffi::Py_am_send, step_send as *mut c_void),
        ffi::PyType_Slot::default(),
    ];
    let mut spec = ffi::PyType_Spec {
        name: c"locksmith.aio.Awaitable".as_ptr(),
        basicsize: c_int::try_from(std::mem::size_of::<Object>()).expect("a small object"),
        itemsize: 0,
        // Made only here: `Awaitable()` from Python would have no future.
        flags: (ffi::Py_TPFLAGS_DEFAULT
            | ffi::Py_TPFLAGS_DISALLOW_INSTANTIATION
            | ffi::Py_TPFLAGS_IMMUTABLETYPE) as c_uint,
        slots: slots.as_mut_ptr(),
    };
    // SAFETY: the spec is complete and its strings and method table are
    // static; CPython copies the slots.
    let made = unsafe { ffi::PyType_FromSpec(&mut spec) };
    // SAFETY: a new reference, or NULL with the error set.
    let made = unsafe { Bound::from_owned_ptr_or_err(py, made) }?;
    Ok(made.cast_into::<PyType>()?.unbind())
}

fn slot(slot: c_int, pfunc: *mut c_void) -> ffi::PyType_Slot {
    ffi::PyType_Slot { slot, pfunc }
}

impl<'py> IntoPyObject<'py> for Awaitable {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let made = awaitable_type(py)?;
        // SAFETY: the type's objects are `Object`s (its basic size); the
        // allocation's header is initialised, the value is written here.
        unsafe {
            let object = ffi::PyType_GenericAlloc(made.as_type_ptr(), 0);
            if object.is_null() {
                return Err(PyErr::fetch(py));
            }
            std::ptr::write(&raw mut (*object.cast::<Object>()).awaitable, self);
            Ok(Bound::from_owned_ptr(py, object))
        }
    }
}

/// Runs `body` on the awaitable `object` for a slot or method CPython
/// calls: its error is set as the current exception (a panic as
/// `PanicException`), and `failed` returned instead.
///
/// # Safety
///
/// The thread is attached to the interpreter, and `object` is an object
/// of the awaitable type, alive for the call (CPython's promise to a slot).
unsafe fn with_awaitable<R>(
    object: *mut ffi::PyObject,
    failed: R,
    body: impl FnOnce(Python<'_>, &Awaitable) -> PyResult<R>,
) -> R {
    // SAFETY: the caller's promise. PyO3's own count of attached calls is
    // not raised: a `Py` dropped inside is released at PyO3's next entry.
    let py = unsafe { Python::assume_attached() };
    // SAFETY: as above.
    let awaitable = unsafe { &(*object.cast::<Object>()).awaitable };
    let error = match catch_unwind(AssertUnwindSafe(|| body(py, awaitable))) {
        Ok(Ok(value)) => return value,
        Ok(Err(error)) => error,
        Err(panic) => panic_error(panic),
    };
    error.restore(py);
    failed
}

fn panic_error(panic: Box<dyn std::any::Any + Send>) -> PyErr {
    let message = match panic.downcast::<String>() {
        Ok(message) => *message,
        Err(panic) => match panic.downcast::<&str>() {
            Ok(message) => (*message).to_owned(),
            Err(_) => "a panic in a locksmith.aio awaitable".to_owned(),
        },
    };
    PanicException::new_err((message,))
}

/// `__await__`: the awaitable is its own iterator.
unsafe extern "C" fn await_self(object: *mut ffi::PyObject) -> *mut ffi::PyObject {
    // SAFETY: CPython passes a live object and takes the new reference.
    unsafe { ffi::Py_IncRef(object) };
    object
}

/// `am_send`: one step of the awaiting task (what `await` calls); a result
/// is returned as it is, with no `StopIteration`.
unsafe extern "C" fn step_send(
    object: *mut ffi::PyObject,
    _sent: *mut ffi::PyObject,
    result: *mut *mut ffi::PyObject,
) -> ffi::PySendResult {
    // SAFETY: CPython calls a slot attached, with an object of the type;
    // `result` is where the step's object goes, NULL on an error.
    unsafe {
        *result = std::ptr::null_mut();
        with_awaitable(object, ffi::PySendResult::PYGEN_ERROR, |py, awaitable| {
            Ok(match awaitable.step(py)? {
                Stepped::Waiting(wait_on) => {
                    *result = wait_on.into_ptr();
                    ffi::PySendResult::PYGEN_NEXT
                }
                Stepped::Returned(value) => {
                    *result = value.into_ptr();
                    ffi::PySendResult::PYGEN_RETURN
                }
            })
        })
    }
}

/// `__next__`: one step, for whoever iterates instead of sending. A `None`
/// result ends with NULL and no exception set (`tp_iternext`'s convention).
unsafe extern "C" fn next(object: *mut ffi::PyObject) -> *mut ffi::PyObject {
    // SAFETY: CPython calls a slot attached, with an object of the type.
    unsafe { step_iterating(object, true) }
}

/// `send(value)`: a step, which must raise `StopIteration` to return.
unsafe extern "C" fn send(
    object: *mut ffi::PyObject,
    _value: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls a method attached, with an object of the type.
    unsafe { step_iterating(object, false) }
}

/// A step as an iterator's: what to wait on, or NULL with the result in a
/// `StopIteration` (no exception for `None` if `quiet_none`).
///
/// # Safety
///
/// As [`with_awaitable`].
unsafe fn step_iterating(object: *mut ffi::PyObject, quiet_none: bool) -> *mut ffi::PyObject {
    // SAFETY: the caller's promise.
    unsafe {
        with_awaitable(
            object,
            std::ptr::null_mut(),
            |py, awaitable| match awaitable.step(py)? {
                Stepped::Waiting(wait_on) => Ok(wait_on.into_ptr()),
                Stepped::Returned(value) if quiet_none && value.is_none(py) => {
                    Ok(std::ptr::null_mut())
                }
                Stepped::Returned(value) => Err(stop_iteration(value.into_bound(py))?),
            },
        )
    }
}

/// `throw(error, value=None, traceback=None)`: drops the future and raises
/// `error`.
unsafe extern "C" fn throw(
    object: *mut ffi::PyObject,
    arguments: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls a method attached, with an object of the type
    // and its positional arguments in a tuple.
    unsafe {
        with_awaitable(object, std::ptr::null_mut(), |py, awaitable| {
            let arguments = Bound::from_borrowed_ptr(py, arguments).cast_into::<PyTuple>()?;
            let (error, value) = match arguments.len() {
                1 => (arguments.get_item(0)?, None),
                2 | 3 => (arguments.get_item(0)?, Some(arguments.get_item(1)?)),
                count => {
                    return Err(PyTypeError::new_err(format!(
                        "throw expected 1 to 3 arguments, got {count}"
                    )))
                }
            };
            // Only a well-formed call ends the awaitable.
            awaitable.finish();
            Err(match value {
                Some(value) if !value.is_none() => PyErr::from_value(value),
                _ => match error.cast::<PyType>() {
                    Ok(class) => PyErr::from_type(class.clone(), ()),
                    Err(_) => PyErr::from_value(error),
                },
            })
        })
    }
}

/// `close()`: drops the future without awaiting it.
unsafe extern "C" fn close(
    object: *mut ffi::PyObject,
    _unused: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls a method attached, with an object of the type.
    unsafe {
        with_awaitable(object, std::ptr::null_mut(), |py, awaitable| {
            awaitable.finish();
            Ok(py.None().into_ptr())
        })
    }
}

/// Drops the awaitable (and with it, its future) and frees the object.
unsafe extern "C" fn dealloc(object: *mut ffi::PyObject) {
    // SAFETY: CPython deallocates attached, an object of the type whose
    // last reference went; the type is a heap type its objects own a
    // reference to.
    unsafe {
        let dropped = catch_unwind(AssertUnwindSafe(|| {
            std::ptr::drop_in_place(&raw mut (*object.cast::<Object>()).awaitable);
        }));
        if let Err(panic) = dropped {
            panic_error(panic).write_unraisable(Python::assume_attached(), None);
        }
        let made = ffi::Py_TYPE(object);
        ffi::PyObject_Free(object.cast());
        ffi::Py_DecRef(made.cast());
    }
}

/// The error that returns `value` from an iterator's step.
fn stop_iteration(value: Bound<'_, PyAny>) -> PyResult<PyErr> {
    Ok(PyStopIteration::new_err(
        stop_iteration_argument(value)?.unbind(),
    ))
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
