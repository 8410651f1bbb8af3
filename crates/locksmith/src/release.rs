//! Holds given back on a task of their own, so that the release reaches the
//! store whatever becomes of the caller: a dropped guard's, the parts of an
//! acquire dropped half way, and a grant that came after its lease ended.

use crate::backend::Hold;

/// Releases a hold on the current tokio runtime without waiting. Outside a
/// runtime nothing can run, and the hold ends with its lease or session.
pub(crate) fn release_in_background(hold: Box<dyn Hold>) {
    drop(spawn_release(hold));
}

/// Releases a hold and waits until the store has answered, on a task of
/// its own, so that the release runs to its end whatever becomes of the
/// caller.
///
/// Cancel safety: safe; dropped, the release still runs to its end.
pub(crate) async fn give_back(hold: Box<dyn Hold>) {
    if let Some(release) = spawn_release(hold) {
        let _ = release.await;
    }
}

/// Spawns the release of `hold` on the current runtime; `None` outside one.
fn spawn_release(hold: Box<dyn Hold>) -> Option<tokio::task::JoinHandle<()>> {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => Some(runtime.spawn(async move {
            if let Err(error) = hold.release().await {
                tracing::debug!(%error, "background release failed");
            }
        })),
        Err(_) => {
            tracing::warn!("guard dropped outside a tokio runtime: the hold ends with its lease");
            None
        }
    }
}
