//! The blocking API (`locksmith.connect`, `Client`, `Lock`, `Guard`, ...):
//! the classes of [`crate::shared`] with the calls that wait, each run on
//! the calling thread with the GIL released and interruptible by Ctrl-C
//! ([`runtime::block`]).

use std::sync::{Arc, Mutex};

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
    /// The `with` blocks of this lock not yet exited.
    blocks: with_blocks::OpenBlocks,
}

impl Lock {
    pub fn new(base: LockBase) -> PyClassInitializer<Self> {
        PyClassInitializer::from(base).add_subclass(Lock {
            blocks: with_blocks::OpenBlocks::default(),
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

    /// Acquires with the lock's own `wait`, opening a block that the
    /// matching `__exit__` closes: the block belongs to the generator (or
    /// coroutine) that runs the `with` statement, wherever it is resumed,
    /// else to this thread.
    fn __enter__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, Guard>> {
        let owner = with_blocks::Owner::current(slf.py())?;
        let guard = Self::acquire_for(slf, None)?;
        let held = guard.as_super().get().held.clone();
        slf.get().blocks.open(slf.py(), owner, held)?;
        Ok(guard)
    }

    /// Releases the hold of the innermost open block of this lock that
    /// belongs to the same generator (or coroutine), else to this thread.
    /// Without one, it closes the only block of this lock still open, or
    /// among several the only one whose thread has ended; else it raises
    /// `RuntimeError` and closes none.
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _traceback: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        match self.blocks.close(py)? {
            Some(held) => exit(py, &held, exc_type, |guard| guard.release()),
            // Its hold ended with its thread and guard (see `with_blocks`).
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

/// Which `__exit__` closes which `with` block of a blocking `Lock`, and
/// what keeps a block's hold until then.
///
/// A `with` statement calls `__enter__` and `__exit__` in one frame. A
/// generator's (or coroutine's) frame can be suspended inside the block and
/// resumed, closed or collected on any thread, so a block opened there
/// belongs to that frame; any other frame runs from start to end on one
/// thread, so a block opened there belongs to the thread. An exit closes
/// the innermost open block of its own owner: blocks of one lock in
/// different generators (a semaphore's, say), advanced in turn on one
/// thread, each close their own. An exit that finds none (called by hand,
/// or by `contextlib.ExitStack`, on a thread that opened no block of this
/// lock) closes the only block of the lock still open, or among several
/// the only one whose thread has ended; otherwise it raises `RuntimeError`
/// and closes none.
///
/// A frame's block keeps its hold here: its generator exits it, at the
/// latest when collected. A thread's block is kept by its thread, in the
/// thread state's dict, which Python clears when the thread ends: a block
/// its thread left open (entered by hand, never exited) then holds no
/// longer than its guard, as an `acquire()`. So nothing is held forever
/// because its exit ran elsewhere, or never; only a block a generator
/// entered by hand and never exits stays until an exit from elsewhere
/// closes it or the lock object goes.
mod with_blocks {
    use std::sync::{Arc, Mutex, MutexGuard, Weak};
    use std::thread::ThreadId;

    use pyo3::exceptions::PyRuntimeError;
    use pyo3::prelude::*;
    use pyo3::types::PyDict;
    use pyo3::{ffi, intern};

    use crate::held::Held;

    type Hold = Arc<Held<locksmith::Guard>>;

    /// `co_flags` of the frames that can be suspended: generators,
    /// coroutines and async generators (`inspect.CO_GENERATOR`, ...).
    const SUSPENDABLE: u32 = 0x20 | 0x80 | 0x200;

    /// Whose exit closes a block.
    #[derive(Clone, Copy, PartialEq, Eq)]
    pub enum Owner {
        /// A generator's or coroutine's frame, by the address of its frame
        /// object, which lives as long as the frame: as long as a block
        /// its `with` statement opened.
        Frame(usize),
        Thread(ThreadId),
    }

    impl Owner {
        /// The owner of a block opened, or closed, by the caller.
        pub fn current(py: Python<'_>) -> PyResult<Self> {
            // SAFETY: the GIL is held. The frame is a borrowed reference to
            // the running frame (NULL outside any), alive during this call.
            let frame = unsafe { ffi::PyEval_GetFrame() };
            if !frame.is_null() {
                // SAFETY: `frame` is a live frame object; `PyFrame_GetCode`
                // returns a new reference to its code object, never NULL.
                let code = unsafe { Bound::from_owned_ptr(py, ffi::PyFrame_GetCode(frame).cast()) };
                if code_flags(code)? & SUSPENDABLE != 0 {
                    return Ok(Owner::Frame(frame as usize));
                }
            }
            Ok(Owner::Thread(std::thread::current().id()))
        }
    }

    /// The `co_flags` of the code object asked about last, and a reference
    /// to it, so that no other code object can take its address while it
    /// is here. A `with` statement asks at its enter and at its exit, a
    /// loop of them about the same code every time, and the attribute
    /// lookup was a fifth of what a blocking `with` block added to its
    /// pair (docs/BENCHMARKS.md, "A `with` block's owner").
    static LAST_CODE: Mutex<Option<(Py<PyAny>, u32)>> = Mutex::new(None);

    /// `code.co_flags` (the limited API has no call for it).
    fn code_flags(code: Bound<'_, PyAny>) -> PyResult<u32> {
        let mut last = lock(&LAST_CODE);
        if let Some((kept, flags)) = &*last {
            if kept.is(&code) {
                return Ok(*flags);
            }
        }
        let flags = code.getattr(intern!(code.py(), "co_flags"))?.extract()?;
        let earlier = last.replace((code.unbind(), flags));
        drop(last);
        drop(earlier);
        Ok(flags)
    }

    /// The holds of the blocks one Python thread opened and has not exited.
    type ThreadHolds = Mutex<Vec<Hold>>;

    /// A Python thread's [`ThreadHolds`], in its thread state's dict: the
    /// holds go when the thread ends.
    #[pyclass(module = "locksmith", frozen)]
    struct ThreadBlocks {
        holds: Arc<ThreadHolds>,
    }

    /// The calling Python thread's holds.
    fn thread_holds(py: Python<'_>) -> PyResult<Arc<ThreadHolds>> {
        // SAFETY: the GIL is held. The dict is a borrowed reference, or
        // NULL (no exception set) when there is none.
        let dict = unsafe { Bound::from_borrowed_ptr_or_opt(py, ffi::PyThreadState_GetDict()) }
            .ok_or_else(|| PyRuntimeError::new_err("no Python thread state to open a block in"))?;
        let dict = dict.cast_into::<PyDict>()?;
        let key = intern!(py, "locksmith.blocking.open_blocks");
        if let Some(found) = dict.get_item(key)? {
            if let Ok(found) = found.cast::<ThreadBlocks>() {
                return Ok(found.get().holds.clone());
            }
        }
        let holds = Arc::new(ThreadHolds::default());
        let blocks = ThreadBlocks {
            holds: holds.clone(),
        };
        dict.set_item(key, Bound::new(py, blocks)?)?;
        Ok(holds)
    }

    fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
        mutex
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// What keeps an open block's hold.
    enum Kept {
        /// The lock's list (a frame's block).
        Here(Hold),
        /// Its thread's [`ThreadHolds`] while the thread runs; then only
        /// its guard.
        ByThread {
            hold: Weak<Held<locksmith::Guard>>,
            thread: Weak<ThreadHolds>,
        },
    }

    struct Block {
        owner: Owner,
        kept: Kept,
    }

    impl Block {
        /// Whether its hold is still there to release (or released by
        /// hand inside the block).
        fn is_open(&self) -> bool {
            match &self.kept {
                Kept::Here(_) => true,
                Kept::ByThread { hold, .. } => hold.strong_count() > 0,
            }
        }

        fn thread_ended(&self) -> bool {
            matches!(&self.kept, Kept::ByThread { thread, .. } if thread.strong_count() == 0)
        }

        /// Its hold, no longer kept by its thread; `None` if it ended with
        /// its thread and guard.
        fn close(self) -> Option<Hold> {
            match self.kept {
                Kept::Here(hold) => Some(hold),
                Kept::ByThread { hold, thread } => {
                    let hold = hold.upgrade()?;
                    if let Some(thread) = thread.upgrade() {
                        let mut holds = lock(&thread);
                        if let Some(index) = holds.iter().rposition(|kept| Arc::ptr_eq(kept, &hold))
                        {
                            holds.remove(index);
                        }
                    }
                    Some(hold)
                }
            }
        }
    }

    /// The open `with` blocks of one lock object, innermost last.
    #[derive(Default)]
    pub struct OpenBlocks(Mutex<Vec<Block>>);

    impl OpenBlocks {
        /// Opens a block of `owner` on `hold`, just acquired.
        pub fn open(&self, py: Python<'_>, owner: Owner, hold: Hold) -> PyResult<()> {
            let kept = match owner {
                Owner::Frame(_) => Kept::Here(hold),
                Owner::Thread(_) => {
                    let thread = thread_holds(py)?;
                    let kept = Kept::ByThread {
                        hold: Arc::downgrade(&hold),
                        thread: Arc::downgrade(&thread),
                    };
                    lock(&thread).push(hold);
                    kept
                }
            };
            let mut blocks = lock(&self.0);
            blocks.retain(Block::is_open);
            blocks.push(Block { owner, kept });
            Ok(())
        }

        /// Closes the block the caller exits (see the module's docs) and
        /// returns its hold; `None` if that ended with its thread and guard.
        pub fn close(&self, py: Python<'_>) -> PyResult<Option<Hold>> {
            let owner = Owner::current(py)?;
            let mut blocks = lock(&self.0);
            blocks.retain(Block::is_open);
            let only = |which: fn(&Block) -> bool| {
                let mut found = blocks.iter().enumerate().filter(|(_, block)| which(block));
                match (found.next(), found.next()) {
                    (Some((index, _)), None) => Some(index),
                    _ => None,
                }
            };
            let index = blocks
                .iter()
                .rposition(|block| block.owner == owner)
                .or_else(|| only(|_| true))
                .or_else(|| only(Block::thread_ended));
            let Some(index) = index else {
                return Err(PyRuntimeError::new_err(match blocks.len() {
                    0 => "no `with` block of this lock is open".to_owned(),
                    open => format!(
                        "none of the {open} open `with` blocks of this lock was entered on this \
                         thread (or in this generator): exit a block on the thread that entered \
                         it, or use acquire() and release()"
                    ),
                }));
            };
            let block = blocks.remove(index);
            drop(blocks);
            Ok(block.close())
        }
    }

    impl Drop for OpenBlocks {
        /// A lock collected with blocks open (entered by hand, never
        /// exited) leaves their holds to their guards.
        fn drop(&mut self) {
            let blocks = std::mem::take(self.0.get_mut().unwrap_or_else(|e| e.into_inner()));
            for block in blocks {
                drop(block.close());
            }
        }
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
