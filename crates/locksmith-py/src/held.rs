//! What a Python guard or leadership holds, for both APIs: the Rust hold
//! until it is released, its lost signal, and the callbacks waiting on it.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::thread::ThreadId;

use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use locksmith::{LostCause, LostSignal};

use crate::errors;
use crate::runtime;

/// A hold of the Rust client: a guard, or a leadership (which holds one).
pub trait Holding: Send + 'static {
    /// The guard: names, fencing tokens, lost signal.
    fn guard(&self) -> &locksmith::Guard;
}

impl Holding for locksmith::Guard {
    fn guard(&self) -> &locksmith::Guard {
        self
    }
}

impl Holding for locksmith::Leadership {
    fn guard(&self) -> &locksmith::Guard {
        locksmith::Leadership::guard(self)
    }
}

/// What a hold answers whatever it holds (for the base class of guards
/// and leaderships, `locksmith._base.HoldBase`).
pub trait Hold: Send + Sync {
    /// The names held, in order.
    fn names(&self) -> &[String];

    /// The fencing token of each name.
    fn tokens(&self) -> &[u64];

    fn lost(&self) -> &LostSignal;

    /// Whether the hold has been released (or given up).
    fn is_released(&self) -> bool;
}

impl<T: Send> Hold for Held<T> {
    fn names(&self) -> &[String] {
        match &self.names {
            Names::Lock(lock) => lock.names(),
            Names::Own(names) => names,
        }
    }

    fn tokens(&self) -> &[u64] {
        match &self.tokens {
            Tokens::One(token) => std::slice::from_ref(token),
            Tokens::Many(tokens) => tokens,
        }
    }

    fn lost(&self) -> &LostSignal {
        &self.lost
    }

    fn is_released(&self) -> bool {
        self.released.load(Ordering::SeqCst)
    }
}

/// The names a hold answers, kept apart from the hold, which goes when
/// released: a released guard still answers them.
enum Names {
    /// Those of the lock it was acquired from (the same, not copied: an
    /// acquire is on the Python side's path, with no allocation to spare).
    Lock(Arc<locksmith::Lock>),
    /// A copy of the hold's own.
    Own(Box<[String]>),
}

/// The fencing tokens a hold answers (as [`Names`]); one, for most.
enum Tokens {
    One(u64),
    Many(Box<[u64]>),
}

impl Tokens {
    fn of(tokens: &[u64]) -> Self {
        match tokens {
            [token] => Tokens::One(*token),
            tokens => Tokens::Many(tokens.into()),
        }
    }
}

/// Where a [`Held`]'s hold is.
enum Slot<T> {
    /// Here.
    Here(T),
    /// Lent to a call running on it ([`Held::lend`]), by this thread; back
    /// when the call returns.
    Lent(ThreadId),
    /// Lent as above, and released meanwhile ([`Held::take`]): handed to
    /// the release when back.
    Handover(oneshot::Sender<T>),
    /// Taken out to be ended.
    Gone,
}

/// A hold (a [`locksmith::Guard`] or [`locksmith::Leadership`]) shared by
/// the Python object that owns it and the calls running on it.
pub struct Held<T: Send> {
    generation: u64,
    names: Names,
    tokens: Tokens,
    hold: Mutex<Slot<T>>,
    lost: LostSignal,
    /// Set when the hold is released or dropped: `on_lost` callbacks are
    /// for losses, not for ends the caller chose.
    released: AtomicBool,
    /// Cancelled once `released` is set, for the calls that wait on it;
    /// made by the first of them (most holds have none, and a token costs
    /// an allocation and locks).
    ended: OnceLock<CancellationToken>,
}

impl<T: Holding> Held<T> {
    /// A hold and a copy of its names.
    pub fn new(hold: T) -> Arc<Self> {
        let names = Names::Own(hold.guard().names().into());
        Self::with_names(hold, names)
    }

    /// A hold acquired from `lock`, whose names it answers.
    pub fn of_lock(hold: T, lock: &Arc<locksmith::Lock>) -> Arc<Self> {
        debug_assert_eq!(hold.guard().names(), lock.names());
        Self::with_names(hold, Names::Lock(lock.clone()))
    }

    fn with_names(hold: T, names: Names) -> Arc<Self> {
        let guard = hold.guard();
        Arc::new(Held {
            generation: runtime::generation(),
            names,
            tokens: Tokens::of(guard.fencing_tokens()),
            lost: guard.lost_signal(),
            hold: Mutex::new(Slot::Here(hold)),
            released: AtomicBool::new(false),
            ended: OnceLock::new(),
        })
    }
}

impl<T: Send> Held<T> {
    fn slot(&self) -> MutexGuard<'_, Slot<T>> {
        self.hold
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Marks the hold released, for whoever waits on [`Held::ended`].
    fn end(&self) {
        self.released.store(true, Ordering::SeqCst);
        if let Some(ended) = self.ended.get() {
            ended.cancel();
        }
    }

    /// A token cancelled once the hold is released (at once if it was).
    fn ended(&self) -> CancellationToken {
        let ended = self.ended.get_or_init(CancellationToken::new).clone();
        // Either `end` saw the token, or this sees `released`.
        if self.released.load(Ordering::SeqCst) {
            ended.cancel();
        }
        ended
    }

    fn not_held(&self) -> PyErr {
        not_held(self.names()[0].clone())
    }

    /// Fails with `Closed` in a forked child.
    pub fn check(&self) -> PyResult<()> {
        runtime::check_generation(self.generation)
    }

    /// Takes the hold out to end it, and marks it released; `NotHeld` if it
    /// was already.
    ///
    /// A hold lent to a call still running on it ([`Held::lend`]: `extend`,
    /// `proclaim`) is taken all the same: it is released from now on (no
    /// more calls on it, no `on_lost` calls), and the [`Taken`] gets it
    /// when that call returns. Refusing instead would leave the caller of a
    /// release (the exit of a `with` block) with a hold it cannot end.
    pub fn take(&self) -> PyResult<Taken<T>> {
        self.check()?;
        let taken = {
            let mut slot = self.slot();
            match std::mem::replace(&mut *slot, Slot::Gone) {
                Slot::Here(hold) => Taken::Here(hold),
                Slot::Lent(lender) => {
                    let (to, back) = oneshot::channel();
                    *slot = Slot::Handover(to);
                    Taken::Lent(Back {
                        back,
                        lender,
                        generation: self.generation,
                        name: self.names()[0].clone(),
                    })
                }
                ended @ (Slot::Handover(_) | Slot::Gone) => {
                    *slot = ended;
                    drop(slot);
                    return Err(self.not_held());
                }
            }
        };
        self.end();
        Ok(taken)
    }

    /// Takes the hold out for a call on it; it goes back when the [`Lent`]
    /// is dropped, so a call cancelled midway leaves the hold in place
    /// (unless released meanwhile: see [`Held::take`]). `NotHeld` while
    /// released, or lent to another call.
    pub fn lend(self: &Arc<Self>) -> PyResult<Lent<T>> {
        self.check()?;
        let mut slot = self.slot();
        let lender = std::thread::current().id();
        match std::mem::replace(&mut *slot, Slot::Lent(lender)) {
            Slot::Here(hold) => Ok(Lent {
                held: self.clone(),
                hold: Some(hold),
            }),
            other => {
                *slot = other;
                drop(slot);
                Err(self.not_held())
            }
        }
    }

    /// Reads the hold while it is held (and not lent).
    pub fn read<R>(&self, f: impl FnOnce(&T) -> R) -> Option<R> {
        match &*self.slot() {
            Slot::Here(hold) => Some(f(hold)),
            _ => None,
        }
    }

    /// Completes with the reason once the hold is lost, or with `None` once
    /// it is released first (a released hold can no longer be lost).
    pub fn lost_or_released(
        &self,
    ) -> impl std::future::Future<Output = Option<String>> + Send + 'static {
        let lost = self.lost.clone();
        let ended = self.ended();
        async move {
            if let Some(reason) = lost.reason() {
                return Some(reason);
            }
            tokio::select! {
                reason = lost.fired() => Some(reason),
                _ = ended.cancelled() => None,
            }
        }
    }

    /// Registers `callback` in `callbacks` (those of the Python object that
    /// owns this hold) and calls it, `callback(cause, reason)`, on a
    /// background thread once the hold is lost, unless it is released
    /// first or that object is gone by then (see [`LossCallbacks`]).
    pub fn on_lost(&self, callbacks: &LossCallbacks, callback: Py<PyAny>) -> PyResult<()> {
        self.check()?;
        let callback = callbacks.add(callback);
        let lost = self.lost.clone();
        let ended = self.ended();
        runtime::spawn(async move {
            tokio::select! {
                biased;
                _ = ended.cancelled() => {}
                reason = lost.fired() => {
                    let cause = lost.cause().unwrap_or_default();
                    runtime::spawn_blocking(move || {
                        runtime::with_python(|py| {
                            if let Some(callback) = callback.take(py) {
                                call(py, callback, cause, reason);
                            }
                        });
                    });
                }
            }
        });
        Ok(())
    }
}

/// A hold taken out of its [`Held`] for one call; back in when dropped.
pub struct Lent<T: Send> {
    held: Arc<Held<T>>,
    /// `Some` until dropped.
    hold: Option<T>,
}

impl<T: Send> Deref for Lent<T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.hold.as_ref().expect("lent until dropped")
    }
}

impl<T: Send> DerefMut for Lent<T> {
    fn deref_mut(&mut self) -> &mut T {
        self.hold.as_mut().expect("lent until dropped")
    }
}

impl<T: Send> Drop for Lent<T> {
    /// Puts the hold back, or hands it to the release that came meanwhile
    /// (dropped, so released in the background, if that stopped waiting).
    fn drop(&mut self) {
        let Some(hold) = self.hold.take() else {
            return;
        };
        let mut slot = self.held.slot();
        match std::mem::replace(&mut *slot, Slot::Gone) {
            Slot::Handover(to) => {
                drop(slot);
                if let Err(hold) = to.send(hold) {
                    drop_hold(self.held.generation, hold);
                }
            }
            // `Lent`: the only other state while lent.
            _ => *slot = Slot::Here(hold),
        }
    }
}

impl<T: Send> Drop for Held<T> {
    /// A hold dropped without release is released in the background, as
    /// the Rust client does; in a forked child it is forgotten (the parent
    /// still holds it, and the child has no runtime of the parent's).
    fn drop(&mut self) {
        self.end();
        let slot = self
            .hold
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // Never lent here: a `Lent` keeps its `Held`.
        if let Slot::Here(hold) = std::mem::replace(slot, Slot::Gone) {
            drop_hold(self.generation, hold);
        }
    }
}

fn not_held(name: String) -> PyErr {
    errors::to_py(locksmith::Error::NotHeld { name })
}

/// Drops a hold that was not released: the Rust client then releases it in
/// the background, on the runtime (entered for that); in a forked child it
/// is forgotten (the parent still holds it, and the child has no runtime
/// of the parent's).
fn drop_hold<T>(generation: u64, hold: T) {
    if generation == runtime::generation() {
        let _entered = runtime::runtime().enter();
        drop(hold);
    } else {
        std::mem::forget(hold);
    }
}

/// A hold taken out to be ended ([`Held::take`]).
pub enum Taken<T> {
    Here(T),
    /// Lent to a call still running on it, and handed over when it returns.
    Lent(Back<T>),
}

impl<T> Taken<T> {
    /// The hold, once back from the call it was lent to (at once if it was
    /// not lent).
    ///
    /// Cancel safety: a hold that comes back after this is dropped is
    /// dropped then, so released in the background.
    pub async fn hold(self) -> PyResult<T> {
        match self {
            Taken::Here(hold) => Ok(hold),
            Taken::Lent(mut back) => back.receive().await,
        }
    }

    /// [`Taken::hold`] for the blocking API: waits with the GIL released,
    /// interruptibly (as [`runtime::block`]). `None` when the call it is
    /// lent to runs on this very thread, interrupted by a signal handler
    /// that ended the hold: waiting for it here would never end, so the
    /// hold is released in the background once that call returns.
    pub fn wait(self, py: Python<'_>) -> PyResult<Option<T>>
    where
        T: Send,
    {
        match self {
            Taken::Here(hold) => Ok(Some(hold)),
            Taken::Lent(back) if back.lender == std::thread::current().id() => Ok(None),
            Taken::Lent(mut back) => runtime::block(py, back.receive())?.map(Some),
        }
    }
}

/// A hold on its way back from the call it is lent to ([`Taken::Lent`]).
pub struct Back<T> {
    back: oneshot::Receiver<T>,
    /// The thread that lent it.
    lender: ThreadId,
    /// Of the [`Held`], for [`drop_hold`].
    generation: u64,
    /// The (first) name held, for a `NotHeld`.
    name: String,
}

impl<T> Back<T> {
    async fn receive(&mut self) -> PyResult<T> {
        // The sender goes with the hold: never dropped without it (a hold
        // lent is given back when its call ends, by `Lent::drop`).
        (&mut self.back)
            .await
            .map_err(|_| not_held(self.name.clone()))
    }
}

impl<T> Drop for Back<T> {
    /// A hold handed over after nobody waits for it any more (the release
    /// was cancelled or interrupted) is dropped: released in the background.
    fn drop(&mut self) {
        self.back.close();
        if let Ok(hold) = self.back.try_recv() {
            drop_hold(self.generation, hold);
        }
    }
}

/// The `on_lost` callbacks of one Python guard or leadership, kept by that
/// object: its class's `__traverse__` shows them to Python's garbage
/// collector and its `__clear__` drops them. What waits for the loss (a
/// task of the runtime, or one of the event loop) has only a [`Registered`]:
/// a weak reference, to take the callback out and call it on a loss if the
/// object is still there.
///
/// A callback commonly refers to its guard (`g.on_lost(lambda c, r:
/// log(g.name))`, or a bound method of an object that keeps the guard).
/// Kept by the waiting task, outside anything the collector sees, it kept
/// its guard alive for ever: the guard was never collected, so never
/// released, and its session's heartbeats kept the lock held. Kept by the
/// guard, such a cycle is an ordinary one, which the collector frees (and a
/// guard collected is released in the background, as any dropped guard).
/// This is the simplest arrangement that is correct: Python objects owned
/// by exactly one Python object, which traverses them; nothing else holds
/// them strongly (a `Held` is shared with `with` blocks and running calls,
/// so callbacks kept there could not be traversed soundly). The price:
/// callbacks go with their guard object, so a guard dropped while a `with`
/// block still holds its lock takes its callbacks with it.
///
/// Every change to the list is made with the GIL held, and nothing under its
/// lock calls Python or drops a Python object, so the collector (which runs
/// with the GIL) never finds it locked, and sees the same list in every pass.
#[derive(Default)]
pub struct LossCallbacks(Arc<Mutex<Vec<Option<Py<PyAny>>>>>);

impl LossCallbacks {
    fn list(&self) -> MutexGuard<'_, Vec<Option<Py<PyAny>>>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Keeps `callback`, to be taken out through what this returns.
    pub fn add(&self, callback: Py<PyAny>) -> Registered {
        let mut list = self.list();
        list.push(Some(callback));
        Registered {
            callbacks: Arc::downgrade(&self.0),
            index: list.len() - 1,
        }
    }

    /// Visits the callbacks kept (for `__traverse__`).
    pub fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        for callback in self.list().iter().flatten() {
            visit.call(callback)?;
        }
        Ok(())
    }

    /// Drops the callbacks (for `__clear__`), after the lock is let go: a
    /// callback's drop can run any Python code.
    pub fn clear(&self) {
        let dropped: Vec<_> = self.list().iter_mut().map(Option::take).collect();
        drop(dropped);
    }
}

/// A callback kept by a [`LossCallbacks`], for the task that calls it.
pub struct Registered {
    callbacks: Weak<Mutex<Vec<Option<Py<PyAny>>>>>,
    index: usize,
}

impl Registered {
    /// The callback, taken out to be called: `None` once the object that
    /// kept it is gone (or was cleared by the collector). With the GIL held
    /// (`_py`), as every change to what the collector traverses.
    pub fn take(self, _py: Python<'_>) -> Option<Py<PyAny>> {
        let callbacks = self.callbacks.upgrade()?;
        let callback = callbacks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get_mut(self.index)
            .and_then(Option::take);
        callback
    }
}

/// Calls `callback(cause, reason)` on the calling (background) thread,
/// reporting an exception it raises as unraisable, as Python does for
/// callbacks nobody awaits.
fn call(py: Python<'_>, callback: Py<PyAny>, cause: LostCause, reason: String) {
    let called =
        errors::lost_cause(py, cause).and_then(|cause| callback.bind(py).call1((cause, reason)));
    if let Err(error) = called {
        error.write_unraisable(py, Some(callback.bind(py)));
    }
}
