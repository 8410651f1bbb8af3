//! Blocking calls made from the server's tasks.

/// Runs `step`, which blocks or may take long (opening the storage,
/// installing a leader's snapshot), without holding up the
/// other tasks of the runtime worker it runs on, openraft's heartbeats among
/// them: on a multi-thread runtime they move to another thread first
/// (`tokio::task::block_in_place`), and the task goes on where it was, with
/// no wake-up on its own path; outside a runtime (the core on a thread of
/// its own) or on a current-thread runtime (a simulation, where nothing else
/// could run meanwhile anyway) it runs in place.
pub(crate) fn run<T>(step: impl FnOnce() -> T) -> T {
    if on_multi_thread_runtime() {
        tokio::task::block_in_place(step)
    } else {
        step()
    }
}

/// Whether this runs within a multi-thread runtime, where a blocking call
/// would hold up the other tasks of its worker.
pub(crate) fn on_multi_thread_runtime() -> bool {
    use tokio::runtime::{Handle, RuntimeFlavor};
    Handle::try_current()
        .is_ok_and(|runtime| runtime.runtime_flavor() == RuntimeFlavor::MultiThread)
}
