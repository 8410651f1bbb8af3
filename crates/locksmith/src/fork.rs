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
//! Each registry is a [`Leaked`](crate::leaked::Leaked) cell: made on
//! first use without a lock, and forgotten, not freed, so that forgetting
//! takes no lock either.

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
