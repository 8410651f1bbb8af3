//! Waking an asyncio event loop from any thread, without the GIL.
//!
//! Every event loop that awaits a pending call gets one [`LoopWaker`]: a
//! socket pair whose reading end the loop watches (`loop.add_reader`), and
//! a queue of the asyncio futures its tasks wait on. The Rust waker of a
//! call, on whatever thread it fires (a runtime worker, mostly), queues the
//! call's future and writes one byte if the queue was empty: it neither
//! takes nor waits for the GIL, which the thread that wakes must not do (it
//! may hold a lock of the client that the GIL's holder is about to take).
//! The loop wakes in its own `select`, and the reader, on the loop's thread
//! and with the GIL, resolves every queued future; the tasks waiting on them
//! step again. A wait costs one thread wake-up, as in a blocking call.
//!
//! The other way, `loop.call_soon_threadsafe`, needs the GIL on the waking
//! thread, so a runtime worker would have to hand it to another thread
//! first: two wake-ups per wait.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

/// The wake-up channel of one event loop.
pub struct LoopWaker {
    /// Futures to resolve on the loop's thread, in the order woken.
    ready: Mutex<Vec<Py<PyAny>>>,
    /// Written by wakers: one byte tells the loop that `ready` filled.
    signal: UnixStream,
    /// Watched by the loop; emptied by [`LoopReader`] before it takes
    /// `ready`, so that no byte for a queued future is read unseen.
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
        let wakers = wakers.bind(py);
        let known = wakers.call_method1(intern!(py, "get"), (event_loop,))?;
        if let Ok(reader) = known.cast::<LoopReader>() {
            return Ok(reader.get().waker.clone());
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
        Ok(waker)
    }

    fn ready(&self) -> MutexGuard<'_, Vec<Py<PyAny>>> {
        self.ready.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Has the loop resolve `future` (an asyncio future of this loop) with
    /// `None`, unless it is done by then. Callable from any thread, with or
    /// without the GIL; never blocks.
    pub fn resolve_soon(&self, future: Py<PyAny>) {
        let first = {
            let mut ready = self.ready();
            ready.push(future);
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

/// The callback the loop runs when its waker's socket is readable.
#[pyclass(module = "locksmith.aio", frozen)]
pub struct LoopReader {
    waker: Arc<LoopWaker>,
}

#[pymethods]
impl LoopReader {
    /// Resolves every future queued since the last call.
    fn __call__(&self, py: Python<'_>) {
        let mut bytes = [0; 64];
        while matches!((&self.waker.readable).read(&mut bytes), Ok(n) if n > 0) {}
        let ready = std::mem::take(&mut *self.waker.ready());
        for future in ready {
            if let Err(error) = resolve(future.bind(py)) {
                error.write_unraisable(py, Some(future.bind(py)));
            }
        }
    }
}

/// Resolves an asyncio future with `None` unless it is done already (as a
/// cancelled one is).
fn resolve(future: &Bound<'_, PyAny>) -> PyResult<()> {
    let py = future.py();
    if !future.call_method0(intern!(py, "done"))?.is_truthy()? {
        future.call_method1(intern!(py, "set_result"), (py.None(),))?;
    }
    Ok(())
}
