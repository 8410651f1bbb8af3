//! A process-wide value made on first use without taking a lock, and
//! leaked rather than freed when forgotten: the cell behind each registry
//! that a forked child must start afresh (`fork.rs`), kept apart so that
//! the registries (in the backends) and the fork's call that forgets them
//! do not import each other.

use std::sync::atomic::{AtomicPtr, Ordering};

/// A process-wide value, made on first use without taking a lock, and
/// leaked: a thread may still use one that was [`forget`](Leaked::forget)ten
/// (and a forgotten one's locks may be held for ever).
pub(crate) struct Leaked<T> {
    current: AtomicPtr<T>,
}

impl<T: Send + Sync> Leaked<T> {
    pub(crate) const fn new() -> Self {
        Leaked {
            current: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// The value, made by `make` if there is none. Two threads may both
    /// make one at first: one wins, the other's is dropped unused.
    pub(crate) fn get_or_make(&self, make: impl FnOnce() -> T) -> &'static T {
        let current = self.current.load(Ordering::Acquire);
        if !current.is_null() {
            // SAFETY: a non-null pointer comes from `Box::into_raw` below
            // and is never freed.
            return unsafe { &*current };
        }
        let made = Box::into_raw(Box::new(make()));
        match self.current.compare_exchange(
            std::ptr::null_mut(),
            made,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            // SAFETY: `made` was just leaked and is never freed.
            Ok(_) => unsafe { &*made },
            Err(winner) => {
                // SAFETY: `made` came from `Box::into_raw` and nobody else
                // has it.
                drop(unsafe { Box::from_raw(made) });
                // SAFETY: as above, `winner` is leaked and never freed.
                unsafe { &*winner }
            }
        }
    }

    /// Makes the next use make a new value; the current one is leaked. No
    /// lock, no allocation, nothing freed.
    pub(crate) fn forget(&self) {
        self.current.store(std::ptr::null_mut(), Ordering::Release);
    }
}

impl<T: Default + Send + Sync> Leaked<T> {
    /// The value, made by `T::default()` if there is none.
    pub(crate) fn get(&self) -> &'static T {
        self.get_or_make(T::default)
    }
}

/// What the registries' own tests share: a forked child's view of a lock.
#[cfg(all(test, any(feature = "redis", feature = "etcd")))]
pub(crate) mod held_elsewhere {
    use std::future::Future;
    use std::sync::{Barrier, Mutex};
    use std::time::Duration;

    /// While another thread holds `lock` (as a thread of the parent's that
    /// the child lacks would), runs `forget`, then `work` on a runtime of a
    /// new thread: `work`'s answer, or `None` when it did not end within 10
    /// s, which it does not if it takes the held lock. On a thread of its
    /// own, so that such a regression fails a test instead of hanging it.
    pub(crate) fn after_forgetting<L, T, F>(
        lock: &Mutex<L>,
        forget: fn(),
        work: impl FnOnce() -> F + Send + 'static,
    ) -> Option<T>
    where
        L: Send,
        T: Send + 'static,
        F: Future<Output = T>,
    {
        let (locked, unlock) = (Barrier::new(2), Barrier::new(2));
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let _held = lock.lock().unwrap();
                locked.wait();
                unlock.wait();
            });
            locked.wait();
            forget();
            let (sender, receiver) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let _ = sender.send(runtime.block_on(work()));
            });
            let answer = receiver.recv_timeout(Duration::from_secs(10)).ok();
            unlock.wait();
            answer
        })
    }
}
