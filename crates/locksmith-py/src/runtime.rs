//! The process's tokio runtime, and the two ways Python waits on it.
//!
//! One runtime per process runs every client's background work (session
//! heartbeats, watchdog renewals, lost signals, the I/O and timers the
//! asyncio API's futures wait on).
//! A blocking call runs its future on the calling thread with the GIL
//! released ([`block`]), waking every [`SIGNAL_CHECK`] to let Python run its
//! signal handlers, so Ctrl-C interrupts a wait (on a timer each thread
//! keeps from call to call); an asyncio call returns an
//! awaitable whose task polls the future on the loop's thread
//! ([`crate::awaitable`]).
//!
//! # Fork
//!
//! A forked child has none of its parent's threads, so neither the runtime
//! nor any client made before the fork can work there. The child's first use
//! of locksmith builds a new runtime; every object made before the fork
//! refuses to work in the child ([`Closed`](crate::errors)), and dropping it
//! there forgets it without a release: the parent still holds what it held.
//!
//! Nor may the child take a lock that a thread of the parent may have held
//! at the fork: that thread is not in the child to unlock it. The parent's
//! runtime and clients are left alone (above), and the Rust crate's
//! process-wide state, which the clients of a process share (`memory://`
//! tables by name, the registries of the cleanups that cancelled Redis and
//! etcd acquires leave running), is new in the child:
//! [`_after_fork_in_child`] has the crate forget the parent's, so that
//! `memory://name` in the child is a new, empty table of that name. The
//! other process-wide state that connecting in the child touches takes no
//! lock, or only with the GIL held (which the forking thread had).

use std::cell::RefCell;
use std::future::Future;
use std::mem::ManuallyDrop;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::task::Poll;
use std::time::Duration;

use pyo3::prelude::*;
use tokio::runtime::Runtime;

use crate::errors;

/// How often a blocked call gives Python a chance to run signal handlers.
pub const SIGNAL_CHECK: Duration = Duration::from_millis(50);

/// Forks this process has gone through since the module was loaded; an
/// object made in an earlier generation belongs to an ancestor process.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// The runtime of this generation; null until first used (and again in a
/// forked child). Runtimes are leaked: one lives as long as its process, and
/// a parent's cannot be shut down in a child, whose threads it lacks.
static RUNTIME: AtomicPtr<Runtime> = AtomicPtr::new(std::ptr::null_mut());

/// The fork generation of this process, to stamp on what it makes.
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

/// Set by `atexit`: the interpreter is shutting down.
static EXITING: AtomicBool = AtomicBool::new(false);

/// Called by `atexit` (registered when the module loads): from now on
/// background threads leave Python alone, as attaching a thread to an
/// interpreter that is finalizing can crash it.
#[pyfunction]
pub fn _at_exit() {
    EXITING.store(true, Ordering::Release);
}

/// Runs `f` with the GIL on a background thread, unless the interpreter is
/// exiting (then `None`): callbacks for a program that is ending are dropped.
pub fn with_python<R>(f: impl for<'py> FnOnce(Python<'py>) -> R) -> Option<R> {
    if EXITING.load(Ordering::Acquire) {
        return None;
    }
    Python::try_attach(f)
}

/// Called by `os.register_at_fork(after_in_child=...)`: the child starts a
/// new generation with a runtime of its own, and the Rust crate's
/// process-wide state of its own (the parent's may be locked for ever by a
/// thread the child lacks). It takes no lock.
#[pyfunction]
pub fn _after_fork_in_child() {
    GENERATION.fetch_add(1, Ordering::AcqRel);
    RUNTIME.store(std::ptr::null_mut(), Ordering::Release);
    locksmith::forget_process_state_after_fork();
}

/// Fails with `Closed` if `made_in` is not this process's generation.
pub fn check_generation(made_in: u64) -> PyResult<()> {
    if made_in == generation() {
        Ok(())
    } else {
        Err(errors::closed(
            "this client was connected before the process forked and cannot be used \
             in the child: connect again in the child",
        ))
    }
}

/// The runtime of this process, built on first use.
pub fn runtime() -> &'static Runtime {
    let current = RUNTIME.load(Ordering::Acquire);
    if !current.is_null() {
        // SAFETY: a non-null pointer comes from `Box::leak` below and is
        // never freed.
        return unsafe { &*current };
    }
    let built = Box::into_raw(Box::new(build()));
    match RUNTIME.compare_exchange(
        std::ptr::null_mut(),
        built,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        // SAFETY: `built` was just leaked and is never freed.
        Ok(_) => unsafe { &*built },
        Err(winner) => {
            // Another thread built one first: use it, drop ours.
            // SAFETY: `built` came from `Box::into_raw` and nobody else has it.
            drop(unsafe { Box::from_raw(built) });
            // SAFETY: as above, `winner` is leaked and never freed.
            unsafe { &*winner }
        }
    }
}

fn build() -> Runtime {
    // One worker, as the Rust blocking client's runtime: blocking calls run
    // their futures on their callers' threads, asyncio calls on the loop's;
    // the worker carries the connections' I/O, the timers and background
    // work. A second worker was woken to steal work on nearly every
    // reply, and cost a blocking pair against the server about 50 µs of
    // CPU (docs/BENCHMARKS.md, "One worker").
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("locksmith")
        .enable_all()
        .build()
        .expect("cannot start the locksmith runtime")
}

/// Runs `future` to completion on the calling thread with the GIL released,
/// as a blocking call of the Python API. Every [`SIGNAL_CHECK`] it takes the
/// GIL back to run Python's signal handlers: if one raises (Ctrl-C's
/// `KeyboardInterrupt`), the future is dropped and the exception returned.
/// Every future given here is cancel-safe (see the client's docs), so an
/// interrupted acquire leaves nothing behind.
pub fn block<F>(py: Python<'_>, future: F) -> PyResult<F::Output>
where
    F: Future + Send,
    F::Output: Send,
{
    let runtime = runtime();
    let mut future = std::pin::pin!(future);
    loop {
        let step = py.detach(|| {
            runtime.block_on(async {
                // Made inside the runtime, whose clock it needs.
                let mut timer = SignalTimer::of_this_thread();
                let mut sleep = timer.sleep();
                // The future first: one ready at once never polls the timer.
                let step = std::future::poll_fn(|cx| match future.as_mut().poll(cx) {
                    Poll::Ready(output) => Poll::Ready(Some(output)),
                    Poll::Pending => sleep.as_mut().poll(cx).map(|()| None),
                })
                .await;
                timer.keep();
                step
            })
        });
        match step {
            Some(output) => return Ok(output),
            None => py.check_signals()?,
        }
    }
}

thread_local! {
    /// This thread's timer for [`block`]'s signal checks.
    static SIGNAL_TIMER: RefCell<Option<SignalTimer>> = const { RefCell::new(None) };
}

/// The timer of one thread's signal checks, kept from call to call: a timer
/// made for each call was registered with the runtime on each, and one due
/// before the runtime's next wake-up wakes its worker to look at it (about
/// 15 µs of CPU a blocking pair against the server). Kept, it is registered
/// again once per [`SIGNAL_CHECK`] at most, so the first check of a call may
/// come sooner than that.
struct SignalTimer {
    /// The fork generation whose runtime the timer belongs to.
    generation: u64,
    sleep: ManuallyDrop<Pin<Box<tokio::time::Sleep>>>,
}

impl SignalTimer {
    /// The timer this thread kept (if of this generation), or a new one;
    /// inside the runtime.
    fn of_this_thread() -> SignalTimer {
        let generation = generation();
        SIGNAL_TIMER
            .take()
            .filter(|timer| timer.generation == generation)
            .unwrap_or_else(|| SignalTimer {
                generation,
                sleep: ManuallyDrop::new(Box::pin(tokio::time::sleep(SIGNAL_CHECK))),
            })
    }

    /// The timer, due [`SIGNAL_CHECK`] from now if it was due already.
    fn sleep(&mut self) -> Pin<&mut tokio::time::Sleep> {
        let mut sleep = self.sleep.as_mut();
        if sleep.is_elapsed() {
            let due = tokio::time::Instant::now() + SIGNAL_CHECK;
            sleep.as_mut().reset(due);
        }
        sleep
    }

    /// Keeps it for this thread's next call.
    fn keep(self) {
        SIGNAL_TIMER.set(Some(self));
    }
}

impl Drop for SignalTimer {
    fn drop(&mut self) {
        // A timer of an earlier generation belongs to the parent's runtime,
        // whose threads the child lacks (and whose locks one of them may
        // have held at the fork): forgotten, as the runtime is.
        if self.generation == generation() {
            // SAFETY: dropped once, here; never used again.
            unsafe { ManuallyDrop::drop(&mut self.sleep) };
        }
    }
}

/// `future`'s output, or `None` if `limit` passes first. Its timer is made
/// when first polled, so inside the runtime that polls it.
pub async fn within<F: Future>(limit: Duration, future: F) -> Option<F::Output> {
    tokio::time::timeout(limit, future).await.ok()
}

/// Spawns `future` on the runtime of this process.
pub fn spawn<F>(future: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    runtime().spawn(future)
}

/// Runs `f` on the runtime's thread pool for blocking work (calls into
/// Python from background tasks: they wait for the GIL).
pub fn spawn_blocking<F>(f: F)
where
    F: FnOnce() + Send + 'static,
{
    runtime().spawn_blocking(f);
}
