//! Waking an asyncio task from any thread, without the GIL.
//!
//! Every event loop that awaits a pending call gets one [`LoopWaker`]: a
//! [`Signal`] the loop watches (`loop.add_reader`; an eventfd on Linux, a
//! socket pair elsewhere), and a queue of the [`Wakeup`]s its tasks wait
//! on. The Rust waker of a call, on whatever thread it fires (a runtime
//! worker, mostly), queues the call's wakeup and raises the signal if the
//! queue was empty: it neither takes nor waits for the GIL, which the
//! thread that wakes must not do (it may hold a lock of the client that the
//! GIL's holder is about to take). The loop wakes in its own `select`, and
//! the reader, on the loop's thread and with the GIL, fires every queued
//! wakeup: each runs its task's step there and then. A wait costs one
//! thread wake-up, as in a blocking call, and one turn of the loop.
//!
//! When the loop has nothing else to do, a step may instead wait in the
//! loop's place ([`LoopWaker::idle_for`], [`LoopWaker::wait`]): on the
//! loop's epoll descriptor, which is readable as soon as anything the loop
//! watches is (its signal among them), for no longer than the loop's next
//! timer. The call's waker then only raises the signal, and the step goes
//! on when it sees its call woken: one thread wake-up and no turn of the
//! loop, which is Python code and costs more than the wake-up on a small
//! machine.
//!
//! The other way, `loop.call_soon_threadsafe`, needs the GIL on the waking
//! thread, so a runtime worker would have to hand it to another thread
//! first: two wake-ups per wait. And an `asyncio.Future` resolved by the
//! reader would step its task only on the loop's next turn (its callbacks
//! go through `call_soon`): two turns per wait, each a `select` and the
//! loop's Python code, which on a busy machine cost more than the thread
//! wake-up itself.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyWeakrefReference};

/// The wake-up channel of one event loop.
pub struct LoopWaker {
    /// Wakeups to fire on the loop's thread, in the order woken.
    ready: Mutex<Vec<Py<Wakeup>>>,
    /// Raised by wakers when `ready` fills; watched by the loop, and
    /// cleared by [`LoopReader`] before it takes `ready`, so that no raise
    /// for a queued wakeup is cleared unseen.
    signal: Signal,
    /// The loop's epoll descriptor, when the loop is asyncio's own selector
    /// loop on Linux: a step whose call is pending may wait on it in the
    /// loop's place ([`LoopWaker::idle_for`]).
    selector: Option<RawFd>,
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
        let waker = Arc::new(LoopWaker {
            ready: Mutex::new(Vec::new()),
            signal: Signal::new()?,
            selector: selector_of(event_loop),
        });
        let reader = Bound::new(
            py,
            LoopReader {
                waker: waker.clone(),
            },
        )?;
        let fd = waker.signal.watched();
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
            self.signal.raise();
        }
    }

    /// Has the loop look at its waker: raises the signal without queuing
    /// a wakeup. Callable from any thread; never blocks.
    pub fn raise(&self) {
        self.signal.raise();
    }

    /// How long a step may wait on the loop's descriptors in the loop's
    /// place, as the loop's `select` would wait next: `None` unless the
    /// loop is asyncio's own selector loop on Linux, not in debug mode or
    /// stopping, with no callback ready; at most the time to its next timer
    /// and [`WAIT_HERE_AT_MOST`]. Reads the loop's private attributes, which
    /// its `_run_once` reads the same way; a loop without them (another
    /// implementation) is never waited for.
    pub fn idle_for(&self, event_loop: &Bound<'_, PyAny>) -> PyResult<Option<Duration>> {
        if self.selector.is_none() {
            return Ok(None);
        }
        let py = event_loop.py();
        if !event_loop.getattr(intern!(py, "_ready"))?.is_empty()?
            || event_loop.getattr(intern!(py, "_stopping"))?.is_truthy()?
            || event_loop.getattr(intern!(py, "_debug"))?.is_truthy()?
        {
            return Ok(None);
        }
        let scheduled = event_loop.getattr(intern!(py, "_scheduled"))?;
        if scheduled.is_empty()? {
            return Ok(Some(WAIT_HERE_AT_MOST));
        }
        let next: f64 = scheduled
            .get_item(0)?
            .getattr(intern!(py, "_when"))?
            .extract()?;
        let now: f64 = event_loop.call_method0(intern!(py, "time"))?.extract()?;
        Ok(Duration::try_from_secs_f64(next - now)
            .ok()
            .filter(|left| !left.is_zero())
            .map(|left| left.min(WAIT_HERE_AT_MOST)))
    }

    /// Waits, with the GIL released, until one of the loop's descriptors is
    /// ready (the loop's signal among them), a signal arrives, or `timeout`
    /// (rounded down to milliseconds) passes.
    pub fn wait(&self, py: Python<'_>, timeout: Duration) {
        let Some(selector) = self.selector else {
            return;
        };
        let millis = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        py.detach(|| poll_readable(selector, millis));
    }

    /// After a raise meant for a step that waited in the loop's place:
    /// clears it, and raises again if wakeups were queued meanwhile, so
    /// that the loop still fires them.
    pub fn took_raise(&self) {
        self.signal.clear();
        if !self.ready().is_empty() {
            self.signal.raise();
        }
    }
}

/// The longest a step waits in its loop's place before it hands the wait
/// to the loop (which then waits in its own `select`, as long as needed).
const WAIT_HERE_AT_MOST: Duration = Duration::from_millis(50);

/// The epoll descriptor of `event_loop`, if it is one of asyncio's own
/// selector loops (its `_run_once` is `BaseEventLoop`'s, its selector an
/// `EpollSelector`): the loop that [`LoopWaker::idle_for`] knows how to read.
#[cfg(target_os = "linux")]
fn selector_of(event_loop: &Bound<'_, PyAny>) -> Option<RawFd> {
    let py = event_loop.py();
    let known = || -> PyResult<Option<RawFd>> {
        let base = py.import("asyncio.base_events")?.getattr("BaseEventLoop")?;
        let run_once = intern!(py, "_run_once");
        if !event_loop
            .get_type()
            .getattr(run_once)?
            .is(&base.getattr(run_once)?)
        {
            return Ok(None);
        }
        let selector = event_loop.getattr(intern!(py, "_selector"))?;
        let epoll = py.import("selectors")?.getattr("EpollSelector")?;
        if !selector.is_instance(&epoll)? {
            return Ok(None);
        }
        selector.call_method0("fileno")?.extract().map(Some)
    };
    known().unwrap_or(None)
}

#[cfg(not(target_os = "linux"))]
fn selector_of(_event_loop: &Bound<'_, PyAny>) -> Option<RawFd> {
    None
}

/// Waits until `fd` is readable, a signal arrives, or `millis` pass.
#[cfg(target_os = "linux")]
fn poll_readable(fd: RawFd, millis: i32) {
    let mut watched = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid `pollfd`, for the length given. Its result is not
    // needed: the caller looks at what it waited for either way.
    unsafe { libc::poll(&mut watched, 1, millis) };
}

#[cfg(not(target_os = "linux"))]
fn poll_readable(_fd: RawFd, _millis: i32) {}

/// The loop's wake-up signal: a descriptor that is readable once raised,
/// until cleared. On Linux an eventfd (a counter: one write to raise, one
/// read to clear), elsewhere a socket pair.
#[cfg(target_os = "linux")]
struct Signal(std::fs::File);

#[cfg(target_os = "linux")]
impl Signal {
    fn new() -> std::io::Result<Self> {
        use std::os::fd::{FromRawFd, OwnedFd};
        // SAFETY: no pointers; the result is checked before use.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened, and nothing else owns it.
        Ok(Signal(unsafe { OwnedFd::from_raw_fd(fd) }.into()))
    }

    /// Callable from any thread; never blocks.
    fn raise(&self) {
        // It fails only when the counter would overflow, which takes 2^64
        // raises that the loop has not cleared: it is raised then.
        let _ = (&self.0).write(&1u64.to_ne_bytes());
    }

    fn clear(&self) {
        let _ = (&self.0).read(&mut [0; 8]);
    }

    fn watched(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

#[cfg(not(target_os = "linux"))]
struct Signal {
    /// Written one byte per raise.
    raised: std::os::unix::net::UnixStream,
    /// Watched by the loop; read empty to clear.
    readable: std::os::unix::net::UnixStream,
}

#[cfg(not(target_os = "linux"))]
impl Signal {
    fn new() -> std::io::Result<Self> {
        let (raised, readable) = std::os::unix::net::UnixStream::pair()?;
        raised.set_nonblocking(true)?;
        readable.set_nonblocking(true)?;
        Ok(Signal { raised, readable })
    }

    /// Callable from any thread; never blocks.
    fn raise(&self) {
        // A full buffer means bytes the loop has not read yet: it will
        // wake anyway. Nothing else can fail on a socket pair whose
        // both ends live as long as this.
        let _ = (&self.raised).write(&[1]);
    }

    fn clear(&self) {
        let mut bytes = [0; 64];
        while matches!((&self.readable).read(&mut bytes), Ok(n) if n > 0) {}
    }

    fn watched(&self) -> RawFd {
        self.readable.as_raw_fd()
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

/// The callback the loop runs when its waker's signal is raised.
#[pyclass(module = "locksmith.aio", frozen)]
pub struct LoopReader {
    waker: Arc<LoopWaker>,
}

#[pymethods]
impl LoopReader {
    /// Fires every wakeup queued since the last call.
    fn __call__(&self, py: Python<'_>) {
        self.waker.signal.clear();
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
