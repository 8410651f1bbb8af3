//! The tokio runtime the server is built to run on.
//!
//! `locksmith serve` runs on one worker by default (README, "Threads"), and
//! its workers have no LIFO slot when built with `--cfg tokio_unstable`, as
//! the workspace's `.cargo/config.toml` builds it.
//!
//! tokio's LIFO slot runs a task woken by the running task next, ahead of
//! the tasks already ready. It is made for a message passed to a task that
//! answers at once; on the server it splits work that would go out
//! together. The core answers a batch of requests on many streams of one
//! HTTP/2 connection, and each stream's task hands its answer to the
//! connection's task. Run next from the slot, the connection's task wrote
//! each answer with a system call of its own. Queued, it runs once every
//! stream has handed its answer over, and writes them in one. The same
//! holds on the way in, for the requests read together and the core they
//! wake. docs/BENCHMARKS.md ("A runtime without the LIFO slot") measures
//! it: a tenth of the writes for idle sessions that share connections, and
//! a shorter handoff.

/// Whether [`build`] turns the workers' LIFO slot off: only tokio's unstable
/// API can, so a build without `--cfg tokio_unstable` keeps it.
pub const LIFO_SLOT_OFF: bool = cfg!(tokio_unstable);

/// A runtime of `worker_threads` workers, with their LIFO slot off where
/// [`LIFO_SLOT_OFF`] says so, whose threads are named `thread_name`.
pub fn build(worker_threads: usize, thread_name: &str) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder
        .worker_threads(worker_threads)
        .thread_name(thread_name)
        .enable_all();
    #[cfg(tokio_unstable)]
    builder.disable_lifo_slot();
    builder.build()
}
