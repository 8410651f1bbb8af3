//! Waking an asyncio task from any thread, without the GIL.
//!
//! Every event loop that awaits a pending call gets one [`LoopWaker`]: a
//! socket pair whose reading end the loop watches (`loop.add_reader`), and
//! a queue of the [`Wakeup`]s its tasks wait on. The Rust waker of a call,
//! on whatever thread it fires (a runtime worker, mostly), queues the call's
//! wakeup and writes one byte if the queue was empty: it neither takes nor
//! waits for the GIL, which the thread that wakes must not do (it may hold
//! a lock of the client that the GIL's holder is about to take). The loop
//! wakes in its own `select`, and the reader, on the loop's thread and with
//! the GIL, fires every queued wakeup: each runs its task's step there and
//! then. A wait costs one thread wake-up, as in a blocking call, and one
//! turn of the loop.
//!
//! The other way, `loop.call_soon_threadsafe`, needs the GIL on the waking
//! thread, so a runtime worker would have to hand it to another thread
//! first: two wake-ups per wait. And an `asyncio.Future` resolved by the
//! reader would step its task only on the loop's next turn (its callbacks
//! go through `call_soon`): two turns per wait, each a `select` and the
//! loop's Python code, which on a busy machine cost more than the thread
//! wake-up itself.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyWeakrefReference};

/// The wake-up channel of one event loop.
pub struct LoopWaker {
    /// Wakeups to fire on the loop's thread, in the order woken.
    ready: Mutex<Vec<Py<Wakeup>>>,
    /// Written by wakers: one byte tells the loop that `ready` filled.
    signal: UnixStream,
    /// Watched by the loop; emptied by [`LoopReader`] before it takes
    /// `ready`, so that no byte for a queued wakeup is read unseen.
    readable: UnixStream,
}

impl LoopWaker {
    /// The waker of `event_loop` (the running loop of the calling thread),
    /// made and registered with the loop the first time.
    pub fn of(event_loop: &Bound<'_, PyAny>) -> PyResult<Arc<LoopWaker>> {
        // Weakly keyed: a loop that is collected takes its waker with it.
        static WAKERS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
        let py = event_loop.py();
        let wakers = WAKERS.get_or_try_init(py, || {
            py.import("weakref")?
                .call_method0("WeakKeyDictionary")
                .map(Bound::unbind)
        })?;
        if let Some(waker) = last_looked_up(event_loop) {
            return Ok(waker);
        }
        let wakers = wakers.bind(py);
        let known = wakers.call_method1(intern!(py, "get"), (event_loop,))?;
        if let Ok(reader) = known.cast::<LoopReader>() {
            let waker = reader.get().waker.clone();
            remember(event_loop, &waker)?;
            return Ok(waker);
        }
        let (signal, readable) = UnixStream::pair()?;
        signal.set_nonblocking(true)?;
        readable.set_nonblocking(true)?;
        let waker = Arc::new(LoopWaker {
            ready: Mutex::new(Vec::new()),
            signal,
            readable,
        });
        let reader = Bound::new(
            py,
            LoopReader {
                waker: waker.clone(),
            },
        )?;
        let fd = waker.readable.as_raw_fd();
        event_loop.call_method1(intern!(py, "add_reader"), (fd, &reader))?;
        wakers.set_item(event_loop, reader)?;
        remember(event_loop, &waker)?;
        Ok(waker)
    }

    fn ready(&self) -> MutexGuard<'_, Vec<Py<Wakeup>>> {
        self.ready.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Has the loop fire `wakeup` (one of this loop's), unless it is done
    /// (cancelled) by then. Callable from any thread, with or without the
    /// GIL; never blocks.
    pub fn wake_soon(&self, wakeup: Py<Wakeup>) {
        let first = {
            let mut ready = self.ready();
            ready.push(wakeup);
            ready.len() == 1
        };
        if first {
            // A full buffer means bytes the loop has not read yet: it will
            // wake anyway. Nothing else can fail on a socket pair whose
            // both ends live as long as this.
            let _ = (&self.signal).write(&[1]);
        }
    }
}

/// The loop whose waker was looked up last, and that waker: a program
/// with one loop finds it here without running the weak dictionary's
/// `get`, which is Python code. Both weak: a loop and its waker are freed
/// with the loop, as without this.
type LastLookedUp = Option<(Py<PyWeakrefReference>, Weak<LoopWaker>)>;
static LAST_LOOKED_UP: Mutex<LastLookedUp> = Mutex::new(None);

fn last_looked_up(event_loop: &Bound<'_, PyAny>) -> Option<Arc<LoopWaker>> {
    let last = LAST_LOOKED_UP.lock().unwrap_or_else(|e| e.into_inner());
    let (known_loop, waker) = last.as_ref()?;
    let known_loop = known_loop.bind(event_loop.py()).upgrade()?;
    if known_loop.is(event_loop) {
        waker.upgrade()
    } else {
        None
    }
}

fn remember(event_loop: &Bound<'_, PyAny>, waker: &Arc<LoopWaker>) -> PyResult<()> {
    let known_loop = PyWeakrefReference::new(event_loop)?.unbind();
    let earlier = LAST_LOOKED_UP
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .replace((known_loop, Arc::downgrade(waker)));
    // Dropped outside the lock: a weak reference's drop is Python code's
    // business, not the lock's.
    drop(earlier);
    Ok(())
}

/// The callback the loop runs when its waker's socket is readable.
#[pyclass(module = "locksmith.aio", frozen)]
pub struct LoopReader {
    waker: Arc<LoopWaker>,
}

#[pymethods]
impl LoopReader {
    /// Fires every wakeup queued since the last call.
    fn __call__(&self, py: Python<'_>) {
        let mut bytes = [0; 64];
        while matches!((&self.waker.readable).read(&mut bytes), Ok(n) if n > 0) {}
        let ready = std::mem::take(&mut *self.waker.ready());
        for wakeup in ready {
            Wakeup::fire(wakeup.bind(py));
        }
    }
}

/// What an asyncio task waits on while a call is pending: the part of
/// `asyncio.Future`'s protocol that `asyncio.Task` uses (a task accepts any
/// object with `_asyncio_future_blocking`, `get_loop`, `add_done_callback`,
/// `cancel` and `result`). Unlike an `asyncio.Future`, firing it (from the
/// loop's reader, see the module's docs) runs the task's callback at once
/// instead of on the loop's next turn. Cancelling it (as a task does when it
/// is cancelled) schedules the callbacks with `call_soon`, as a future does:
/// a cancel comes from another task's step, inside which no task may step.
#[pyclass(module = "locksmith.aio", frozen)]
pub struct Wakeup {
    event_loop: Py<PyAny>,
    /// `_asyncio_future_blocking`: set when yielded to the task, which
    /// clears it when it starts waiting.
    blocking: AtomicBool,
    state: Mutex<WakeupState>,
}

#[derive(Default)]
struct WakeupState {
    /// `None` while pending; `Some(None)` once fired; `Some(Some(message))`
    /// once cancelled.
    ended: Option<Option<Py<PyAny>>>,
    /// In the order added.
    callbacks: Vec<DoneCallback>,
}

/// A callback given to `add_done_callback`, and the context to run it in.
struct DoneCallback {
    callback: Py<PyAny>,
    context: Option<Py<PyAny>>,
}

impl Wakeup {
    /// A pending wakeup of `event_loop`, as a task expects it yielded.
    pub fn new(event_loop: Py<PyAny>) -> Self {
        Wakeup {
            event_loop,
            blocking: AtomicBool::new(true),
            state: Mutex::new(WakeupState::default()),
        }
    }

    fn state(&self) -> MutexGuard<'_, WakeupState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ends the wait (`message`: cancelled) and takes the callbacks to run;
    /// none if it had ended already.
    fn end(&self, message: Option<Py<PyAny>>) -> Option<Vec<DoneCallback>> {
        let mut state = self.state();
        if state.ended.is_some() {
            return None;
        }
        state.ended = Some(message);
        Some(std::mem::take(&mut state.callbacks))
    }

    /// Runs every callback now (on the loop's thread, outside any task),
    /// each in its context; one that raises is reported as unraisable, as
    /// the loop does.
    fn fire(slf: &Bound<'_, Self>) {
        let Some(callbacks) = slf.get().end(None) else {
            return;
        };
        let py = slf.py();
        for DoneCallback { callback, context } in callbacks {
            let called = match &context {
                Some(context) => context
                    .bind(py)
                    .call_method1(intern!(py, "run"), (&callback, slf)),
                None => callback.bind(py).call1((slf,)),
            };
            if let Err(error) = called {
                error.write_unraisable(py, Some(callback.bind(py)));
            }
        }
    }

    /// Has the loop run `callback(self)` on its next turn, in `context`.
    fn call_soon(
        slf: &Bound<'_, Self>,
        callback: &Py<PyAny>,
        context: Option<&Py<PyAny>>,
    ) -> PyResult<()> {
        let py = slf.py();
        let keywords = PyDict::new(py);
        keywords.set_item(intern!(py, "context"), context)?;
        slf.get().event_loop.bind(py).call_method(
            intern!(py, "call_soon"),
            (callback, slf),
            Some(&keywords),
        )?;
        Ok(())
    }
}

#[pymethods]
impl Wakeup {
    #[getter(_asyncio_future_blocking)]
    fn blocking(&self) -> bool {
        self.blocking.load(Ordering::Relaxed)
    }

    #[setter(_asyncio_future_blocking)]
    fn set_blocking(&self, blocking: bool) {
        self.blocking.store(blocking, Ordering::Relaxed);
    }

    fn get_loop(&self, py: Python<'_>) -> Py<PyAny> {
        self.event_loop.clone_ref(py)
    }

    fn done(&self) -> bool {
        self.state().ended.is_some()
    }

    fn cancelled(&self) -> bool {
        matches!(self.state().ended, Some(Some(_)))
    }

    /// `None` once fired; raises `CancelledError` once cancelled.
    fn result(&self, py: Python<'_>) -> PyResult<()> {
        match &self.state().ended {
            Some(None) => Ok(()),
            Some(Some(message)) => Err(cancelled_error(py, message.bind(py))?),
            None => Err(invalid_state(py)?),
        }
    }

    /// `None` once fired; raises `CancelledError` once cancelled.
    fn exception(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        self.result(py).map(|()| None)
    }

    #[pyo3(signature = (callback, *, context=None))]
    fn add_done_callback(
        slf: &Bound<'_, Self>,
        callback: Py<PyAny>,
        context: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        {
            let mut state = slf.get().state();
            if state.ended.is_none() {
                state.callbacks.push(DoneCallback { callback, context });
                return Ok(());
            }
        }
        Self::call_soon(slf, &callback, context.as_ref())
    }

    fn remove_done_callback(&self, callback: &Bound<'_, PyAny>) -> PyResult<usize> {
        let mut state = self.state();
        let before = state.callbacks.len();
        let mut kept = Vec::with_capacity(before);
        for entry in std::mem::take(&mut state.callbacks) {
            if !entry.callback.bind(callback.py()).eq(callback)? {
                kept.push(entry);
            }
        }
        state.callbacks = kept;
        Ok(before - state.callbacks.len())
    }

    /// Ends the wait as cancelled; the callbacks run on the loop's next
    /// turn. `False` if it had ended already.
    #[pyo3(signature = (msg=None))]
    fn cancel(slf: &Bound<'_, Self>, msg: Option<Py<PyAny>>) -> PyResult<bool> {
        let py = slf.py();
        let message = msg.unwrap_or_else(|| py.None());
        let Some(callbacks) = slf.get().end(Some(message)) else {
            return Ok(false);
        };
        for DoneCallback { callback, context } in callbacks {
            Self::call_soon(slf, &callback, context.as_ref())?;
        }
        Ok(true)
    }
}

/// `asyncio.CancelledError(message)` (no argument for `None`).
fn cancelled_error(py: Python<'_>, message: &Bound<'_, PyAny>) -> PyResult<PyErr> {
    static CANCELLED: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let class = CANCELLED.import(py, "asyncio", "CancelledError")?;
    let error = if message.is_none() {
        class.call0()?
    } else {
        class.call1((message,))?
    };
    Ok(PyErr::from_value(error))
}

/// `asyncio.InvalidStateError`: the result of a wait not yet ended.
fn invalid_state(py: Python<'_>) -> PyResult<PyErr> {
    static INVALID: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let class = INVALID.import(py, "asyncio", "InvalidStateError")?;
    Ok(PyErr::from_value(class.call1(("Result is not ready.",))?))
}
