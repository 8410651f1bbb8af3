//! What a Python guard or leadership holds, for both APIs: the Rust hold
//! until it is released, its lost signal, and the callbacks waiting on it.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use pyo3::prelude::*;
use tokio_util::sync::CancellationToken;

use locksmith::LostSignal;

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

/// A hold (a [`locksmith::Guard`] or [`locksmith::Leadership`]) shared by
/// the Python object that owns it and the calls running on it.
pub struct Held<T: Send> {
    generation: u64,
    names: Names,
    tokens: Tokens,
    hold: Mutex<Option<T>>,
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
            hold: Mutex::new(Some(hold)),
            released: AtomicBool::new(false),
            ended: OnceLock::new(),
        })
    }
}

impl<T: Send> Held<T> {
    fn slot(&self) -> MutexGuard<'_, Option<T>> {
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

    /// Fails with `Closed` in a forked child.
    pub fn check(&self) -> PyResult<()> {
        runtime::check_generation(self.generation)
    }

    /// Takes the hold out to end it; `NotHeld` if it was already.
    pub fn take(&self) -> PyResult<T> {
        self.check()?;
        let hold = self.slot().take();
        self.end();
        hold.ok_or_else(|| {
            errors::to_py(locksmith::Error::NotHeld {
                name: self.names()[0].clone(),
            })
        })
    }

    /// Takes the hold out for a call on it; it goes back when the [`Lent`]
    /// is dropped, so a call cancelled midway leaves the hold in place.
    pub fn lend(self: &Arc<Self>) -> PyResult<Lent<T>> {
        self.check()?;
        let hold = self.slot().take().ok_or_else(|| {
            errors::to_py(locksmith::Error::NotHeld {
                name: self.names()[0].clone(),
            })
        })?;
        Ok(Lent {
            held: self.clone(),
            hold: Some(hold),
        })
    }

    /// Reads the hold while it is held.
    pub fn read<R>(&self, f: impl FnOnce(&T) -> R) -> Option<R> {
        self.slot().as_ref().map(f)
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

    /// Calls `deliver(cause, reason)` on a background thread once the hold
    /// is lost, unless it is released first; `deliver` runs the user's
    /// callback there or hands it to an event loop.
    pub fn on_lost(
        &self,
        deliver: impl FnOnce(Py<PyAny>, String) + Send + 'static,
    ) -> PyResult<()> {
        self.check()?;
        let lost = self.lost.clone();
        let ended = self.ended();
        runtime::spawn(async move {
            tokio::select! {
                biased;
                _ = ended.cancelled() => {}
                reason = lost.fired() => {
                    let cause = lost.cause().unwrap_or_default();
                    runtime::spawn_blocking(move || {
                        let cause = runtime::with_python(|py| {
                            errors::lost_cause(py, cause)
                                .map(Bound::unbind)
                                .map_err(|error| error.write_unraisable(py, None))
                                .ok()
                        });
                        if let Some(Some(cause)) = cause {
                            deliver(cause, reason);
                        }
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
    fn drop(&mut self) {
        *self.held.slot() = self.hold.take();
    }
}

impl<T: Send> Drop for Held<T> {
    /// A hold dropped without release is released in the background, as
    /// the Rust client does; in a forked child it is forgotten (the parent
    /// still holds it, and the child has no runtime of the parent's).
    fn drop(&mut self) {
        self.end();
        let hold = self
            .hold
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(hold) = hold {
            if self.generation == runtime::generation() {
                let _entered = runtime::runtime().enter();
                drop(hold);
            } else {
                std::mem::forget(hold);
            }
        }
    }
}

/// Calls `callback(cause, reason)` on the calling (background) thread,
/// reporting an exception it raises as unraisable, as Python does for
/// callbacks nobody awaits.
pub fn call_here(callback: Py<PyAny>, cause: Py<PyAny>, reason: String) {
    runtime::with_python(|py| {
        if let Err(error) = callback.bind(py).call1((cause, reason)) {
            error.write_unraisable(py, Some(callback.bind(py)));
        }
    });
}
