//! Process-wide state, and what a forked child must forget of it.
//!
//! A few registries are shared by every client of a process: the
//! `memory://` tables by name, and the cleanups that cancelled Redis and
//! etcd acquires left running, which inspection waits for. Each is guarded
//! by a lock that the threads of the process take often. The child of a
//! `fork` has only the thread that forked: a lock that another thread held
//! at that moment stays held in the child for ever, and a child that took
//! it (connecting to `memory://`, inspecting a Redis or etcd lock after an
//! acquire was cancelled) would hang. [`forget_process_state_after_fork`]
//! has the child start registries of its own.
//!
//! Each registry is a [`Leaked`] cell: made on first use without a lock,
//! and forgotten, not freed, so that forgetting takes no lock either.

#[cfg(any(feature = "memory", feature = "redis", feature = "etcd"))]
use std::sync::atomic::{AtomicPtr, Ordering};

/// Makes the clients connected from now on use process-wide state of their
/// own instead of the state of the clients connected before: new, empty
/// `memory://` tables, and new registries of background cleanups (Redis,
/// etcd). Call it in the child of a `fork`, before the child connects.
///
/// Why: the child has only the thread that forked. Another thread of the
/// parent that was inside a call on that state at the fork held its lock,
/// and the lock stays held in the child for ever; a child that took it would
/// hang. After this call `memory://name` is a new, empty table of that name
/// in the child (the parent's holders are not in the child), and a Redis or
/// etcd inspection waits only for the cleanups of the child's own clients.
///
/// It takes no lock, allocates nothing and frees nothing (the earlier state
/// is forgotten, not dropped), so it is sound to call at any time, in any
/// process, from an `atfork` child handler too. Clients connected before
/// the call keep what they use, so a child must neither use nor drop the
/// clients (and guards, elections, streams) it inherited from its parent:
/// dropping one may take a lock of its parent's (of a table, of a
/// connection). Forget them ([`std::mem::forget`]). Without a fork, the call
/// only splits the clients connected after it from those connected before:
/// their `memory://` tables are apart, and an inspection no longer waits
/// for the cleanups of clients connected before.
pub fn forget_process_state_after_fork() {
    #[cfg(feature = "memory")]
    crate::memory::forget_tables();
    #[cfg(feature = "redis")]
    crate::redis::forget_cleanups();
    #[cfg(feature = "etcd")]
    crate::etcd::forget_cleanups();
}

/// A process-wide value, made on first use without taking a lock, and
/// leaked: a thread may still use one that was [`forget`](Leaked::forget)ten
/// (and a forgotten one's locks may be held for ever).
#[cfg(any(feature = "memory", feature = "redis", feature = "etcd"))]
pub(crate) struct Leaked<T> {
    current: AtomicPtr<T>,
}

#[cfg(any(feature = "memory", feature = "redis", feature = "etcd"))]
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

#[cfg(any(feature = "memory", feature = "redis", feature = "etcd"))]
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
