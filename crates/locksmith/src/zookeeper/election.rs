//! What only elections do on ZooKeeper: follow the leader. (Changing the
//! leader's value is a write of the hold's own node, with the hold:
//! `super::hold`.)
//!
//! A candidate is a lock contender whose node data is its value (as Curator's
//! `LeaderSelector` and kazoo's `Election` store their participant id), and
//! the leader is the lock's holder: the first contender. The node name is
//! Curator's or kazoo's ([`super::config::Elections`]).

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use zookeeper_client as zk;

use super::acquire::zk_error;
use super::layout;
use super::session::Session;
use crate::backend::HolderChanges;
use crate::error::Result;

/// Wake-ups whenever the contenders of `dir` or the first one's data change.
/// The next watches are set before a wake-up is delivered, so nothing falls
/// between a wake-up and the reader's next look. The stream ends after an
/// error (the session ended, for one); observing starts over from there.
///
/// Cancel safety: safe; dropped watches are simply never awaited.
pub(crate) async fn watch_holders(session: Arc<Session>, dir: String) -> Result<HolderChanges> {
    let armed = arm(&session, &dir).await?;
    let wake_ups = futures::stream::unfold(Some((session, dir, armed)), |state| async move {
        let (session, dir, armed) = state?;
        armed.await;
        Some(match arm(&session, &dir).await {
            Ok(next) => (Ok(()), Some((session, dir, next))),
            Err(error) => (Err(error), None),
        })
    });
    Ok(wake_ups.boxed())
}

/// Sets the watches that fire on the next change of who leads or what it
/// publishes: the children of `dir` (its creation, while it does not exist)
/// and the data of its first contender. Completes at the first that fires.
///
/// Cancel safety: safe, read-only.
async fn arm(session: &Session, dir: &str) -> Result<BoxFuture<'static, ()>> {
    let client = &session.client;
    let failed = |error| zk_error("watching the election", error);
    loop {
        let (children, children_changed) =
            match session.retry(|| client.get_and_watch_children(dir)).await {
                Ok((children, _, watcher)) => (children, watcher),
                Err(zk::Error::NoNode) => {
                    let (stat, created) = session
                        .retry(|| client.check_and_watch_stat(dir))
                        .await
                        .map_err(failed)?;
                    if stat.is_some() {
                        continue; // Created in between: watch its children.
                    }
                    return Ok(async move {
                        created.changed().await;
                    }
                    .boxed());
                }
                Err(error) => return Err(failed(error)),
            };
        let mut wakes = vec![async move {
            children_changed.changed().await;
        }
        .boxed()];
        if let Some(first) = layout::contenders(&children).first() {
            let path = layout::child_path(dir, first);
            match session.retry(|| client.get_and_watch_data(&path)).await {
                Ok((_, _, data_changed)) => wakes.push(
                    async move {
                        data_changed.changed().await;
                    }
                    .boxed(),
                ),
                // Gone already: the children's watch has fired.
                Err(zk::Error::NoNode) => {}
                Err(error) => return Err(failed(error)),
            }
        }
        return Ok(futures::future::select_all(wakes).map(|_| ()).boxed());
    }
}
