//! Acquiring: the contender queue (exclusive and read-write locks) and the
//! semaphore, as Curator's recipes do it.

use std::sync::Arc;
use std::time::Duration;

use locksmith_core::Mode;
use zookeeper_client as zk;

use super::layout::{self, Standing};
use super::session::Session;
use super::BACKEND;
use crate::backend::Wait;
use crate::error::{Error, Result};

/// How long dropping an unfinished acquire waits for its node to be deleted
/// (on a multi-thread runtime), so the lock's queue is clean when the drop
/// returns. On a current-thread runtime, or past this, it completes in the
/// background.
const CLEANUP_WAIT: Duration = Duration::from_secs(1);

/// A node of ours, as acquired.
pub(crate) struct Node {
    /// Full path.
    pub path: String,
    /// Its creation zxid: the fencing token.
    pub czxid: u64,
}

/// Converts a ZooKeeper error, naming what was being done.
pub(crate) fn zk_error(doing: &str, error: zk::Error) -> Error {
    let hint = match error {
        zk::Error::NoAuth => {
            " (the node's ACL refuses this client: give the URL the credentials \
             that created it, zk://user:password@…)"
        }
        _ => "",
    };
    Error::backend(BACKEND, format!("{doing}: {error}{hint}"))
}

fn node_options(acls: zk::Acls<'static>) -> zk::CreateOptions<'static> {
    zk::CreateMode::EphemeralSequential.with_acls(acls)
}

/// Ancestors are container nodes, as Curator's `creatingParentContainersIfNeeded`
/// makes them: the server removes them once they are empty again.
fn dir_options(acls: zk::Acls<'static>) -> zk::CreateOptions<'static> {
    zk::CreateMode::Container.with_acls(acls)
}

/// A node an acquire is creating or has created, deleted if the acquire does
/// not complete (error, `Ok(None)`, timeout, drop). Until the create's answer
/// arrives the path is unknown; the protected prefix then finds it.
pub(crate) struct Pending {
    session: Arc<Session>,
    dir: String,
    node_name: &'static str,
    prefix: String,
    path: Option<String>,
}

impl Pending {
    pub fn new(session: &Arc<Session>, dir: &str, node_name: &'static str) -> Pending {
        Pending {
            session: session.clone(),
            dir: dir.to_owned(),
            node_name,
            prefix: layout::protected_name(node_name),
            path: None,
        }
    }

    /// The node's name within its directory, once created.
    fn node(&self) -> &str {
        let path = self.path.as_deref().expect("created");
        &path[self.dir.len() + 1..]
    }

    /// Creates the node (and its ancestors), with protection: after a
    /// connection loss during the create, the protected prefix finds the node
    /// if the create went through, so there is never a second one. Returns the
    /// children of the directory, read just after the create (the two requests
    /// are pipelined: ZooKeeper answers a session's requests in order, so the
    /// list includes our node).
    ///
    /// Cancel safety: safe; the drop deletes whatever was created.
    async fn create(&mut self, data: &[u8]) -> Result<(Node, Vec<String>)> {
        let session = self.session.clone();
        let client = &session.client;
        let base = layout::child_path(&self.dir, &self.prefix);
        loop {
            let options = node_options(session.acls);
            let create = client.create(&base, data, &options);
            let list = client.list_children(&self.dir);
            let (created, listed) = tokio::join!(create, list);
            match created {
                Ok((stat, sequence)) => {
                    let path = format!("{base}{sequence}");
                    tracing::debug!(%path, czxid = stat.czxid, "contender created");
                    self.path = Some(path.clone());
                    let children = match listed {
                        Ok(children) => children,
                        Err(_) => session
                            .children(&self.dir)
                            .await
                            .map_err(|e| zk_error("listing contenders", e))?,
                    };
                    return Ok((
                        Node {
                            path,
                            czxid: stat.czxid as u64,
                        },
                        children,
                    ));
                }
                Err(zk::Error::NoNode) => {
                    let dir_options = dir_options(session.acls);
                    session
                        .retry(|| client.mkdir(&self.dir, &dir_options))
                        .await
                        .map_err(|e| zk_error("creating the lock path", e))?;
                }
                Err(zk::Error::ConnectionLoss) if !session.is_over() => {
                    if let Some(found) = self.find().await? {
                        return Ok(found);
                    }
                }
                Err(error) => return Err(zk_error("creating the contender node", error)),
            }
        }
    }

    /// Looks for our protected node after a connection loss during its create.
    ///
    /// Cancel safety: safe, read-only (the drop of `self` cleans up).
    async fn find(&mut self) -> Result<Option<(Node, Vec<String>)>> {
        let session = self.session.clone();
        let children = session
            .children(&self.dir)
            .await
            .map_err(|e| zk_error("listing contenders", e))?;
        let Some(node) = children.iter().find(|c| c.starts_with(&self.prefix)) else {
            return Ok(None);
        };
        let path = layout::child_path(&self.dir, node);
        let stat = match session.retry(|| session.client.check_stat(&path)).await {
            Ok(Some(stat)) => stat,
            Ok(None) => return Ok(None),
            Err(error) => return Err(zk_error("reading the contender node", error)),
        };
        tracing::debug!(%path, "found our node after a connection loss");
        self.path = Some(path.clone());
        Ok(Some((
            Node {
                path,
                czxid: stat.czxid as u64,
            },
            children,
        )))
    }

    /// Starts over with a fresh protected name (our node vanished, CURATOR-604).
    fn reset(&mut self) {
        self.prefix = layout::protected_name(self.node_name);
        self.path = None;
    }

    /// Deletes the node now and disarms the guard.
    ///
    /// Cancel safety: if dropped midway, the drop finishes the delete.
    async fn abandon(mut self) -> Result<()> {
        if let Some(path) = &self.path {
            self.session
                .delete(path)
                .await
                .map_err(|e| zk_error("deleting our node", e))?;
        }
        self.path = None;
        self.prefix.clear();
        Ok(())
    }

    /// The acquire completed: keep the node.
    pub fn keep(mut self) {
        self.prefix.clear();
        self.path = None;
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.prefix.is_empty() {
            return;
        }
        let (session, dir, prefix, path) = (
            self.session.clone(),
            std::mem::take(&mut self.dir),
            std::mem::take(&mut self.prefix),
            self.path.take(),
        );
        cleanup(async move {
            let path = match path {
                Some(path) => Some(path),
                None => session.children(&dir).await.ok().and_then(|children| {
                    children
                        .into_iter()
                        .find(|c| c.starts_with(&prefix))
                        .map(|c| layout::child_path(&dir, &c))
                }),
            };
            if let Some(path) = path {
                match session.delete(&path).await {
                    Ok(_) => tracing::debug!(%path, "abandoned contender deleted"),
                    Err(error) => {
                        tracing::debug!(%path, %error, "abandoned contender left to the session")
                    }
                }
            }
        });
    }
}

/// Runs the cleanup of a dropped acquire. On a multi-thread runtime the drop
/// waits for it (at most [`CLEANUP_WAIT`]), so that once an acquire future is
/// gone its node is gone too, as seen by every client; elsewhere it runs in
/// the background. Outside a runtime nothing can run: the session ends the
/// node.
fn cleanup(work: impl std::future::Future<Output = ()> + Send + 'static) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!("acquire dropped outside a tokio runtime: its node ends with the session");
        return;
    };
    let (done, finished) = std::sync::mpsc::channel::<()>();
    runtime.spawn(async move {
        work.await;
        let _ = done.send(());
    });
    if runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
        && !std::thread::panicking()
    {
        // `block_in_place` refuses (panics) where blocking is not allowed, such
        // as inside a `LocalSet`; the cleanup then simply runs on.
        let _ = std::panic::catch_unwind(|| {
            tokio::task::block_in_place(|| finished.recv_timeout(CLEANUP_WAIT))
        });
    }
}

/// Waits in the contender queue of `dir` for `mode` (exclusive or shared).
///
/// With [`Wait::No`] a busy lock is answered from one read, without writing.
/// Otherwise: create our node, then until it holds, watch the one node whose
/// deletion can change that (the predecessor, or for a reader the nearest
/// writer ahead) and look again on every wake-up and every reconnection,
/// re-creating our node if it vanished (CURATOR-604). With `kazoo` the node
/// is a kazoo `Lock` contender (an election shared with kazoo's `Election`).
///
/// Cancel safety: safe; a dropped or failed acquire deletes its node.
#[tracing::instrument(name = "zookeeper.queue", skip_all, fields(%dir, %mode))]
pub(crate) async fn queue(
    session: &Arc<Session>,
    dir: &str,
    mode: Mode,
    data: &[u8],
    wait: Wait,
    kazoo: bool,
) -> Result<Option<(Node, Pending)>> {
    let mut node_name = layout::node_name_for(mode, &[]);
    // A writer must know whether a read-write lock is in use before it
    // queues: a `lock-` node replaced by a `__WRIT__` one would leave a moment
    // without a writer in the queue, and a reader arriving then would pass
    // it (the conformance suite's writer fairness caught it).
    if wait == Wait::No || mode == Mode::Exclusive {
        let children = session
            .children(dir)
            .await
            .map_err(|e| zk_error("listing contenders", e))?;
        if wait == Wait::No && !layout::would_hold_now(&layout::contenders(&children), mode) {
            return Ok(None);
        }
        node_name = layout::node_name_for(mode, &children);
    }
    if kazoo {
        node_name = layout::KAZOO_LOCK_NAME;
    }
    let mut pending = Pending::new(session, dir, node_name);
    let (mut node, mut children) = pending.create(data).await?;
    loop {
        let contenders = layout::contenders(&children);
        let standing = layout::standing(&contenders, pending.node());
        if mode == Mode::Exclusive
            && pending.node_name == layout::MUTEX_NAME
            && contenders.iter().any(|c| layout::is_read_write(c))
        {
            // A read-write lock is in use on this path, whose readers only see
            // `__WRIT__` nodes: queue again under that name.
            tracing::debug!("read-write nodes present: re-queueing as a writer");
            let old =
                std::mem::replace(&mut pending, Pending::new(session, dir, layout::WRITE_NAME));
            old.abandon().await?;
            (node, children) = pending.create(data).await?;
            continue;
        }
        match standing {
            Standing::Holds => return Ok(Some((node, pending))),
            Standing::Missing => {
                if session.is_over() {
                    return Err(zk_error("waiting for the lock", zk::Error::SessionExpired));
                }
                tracing::warn!(path = %node.path, "our contender node vanished; queueing again (CURATOR-604)");
                pending.reset();
                (node, children) = pending.create(data).await?;
                continue;
            }
            Standing::Waits(_) if wait == Wait::No => {
                pending.abandon().await?;
                return Ok(None);
            }
            Standing::Waits(ahead) => {
                let ahead = layout::child_path(dir, ahead);
                wait_for_change(session, &ahead).await?;
            }
        }
        children = session
            .children(dir)
            .await
            .map_err(|e| zk_error("listing contenders", e))?;
    }
}

/// Waits until the node `ahead` changes (deleted, above all) or the connection
/// state does (after a reconnection we look again). Uses `getData` with a
/// watch, as Curator does, so no watch is left behind on a missing node.
///
/// Cancel safety: safe; dropping it drops the watch.
async fn wait_for_change(session: &Session, ahead: &str) -> Result<()> {
    let mut states = session.client.state_watcher();
    let watched = session
        .retry(|| session.client.get_and_watch_data(ahead))
        .await;
    match watched {
        Ok((_, _, watcher)) => {
            tracing::trace!(%ahead, "watching");
            tokio::select! {
                _ = watcher.changed() => {}
                _ = states.changed() => {}
            }
            Ok(())
        }
        Err(zk::Error::NoNode) => Ok(()),
        Err(error) => Err(zk_error("watching the contender ahead", error)),
    }
}

/// Acquires one lease of a semaphore in Curator's `InterProcessSemaphoreV2`
/// layout: take the mutex `<path>/locks`, create a lease node under
/// `<path>/leases`, wait (still holding the mutex, watching the leases) until
/// there are at most `permits` leases, then release the mutex. The lease node
/// is the hold.
///
/// The number of permits is recorded as decimal text in the data of `<path>`
/// (kazoo's `Semaphore` convention; Curator keeps nothing there). A request
/// naming another number while leases are out is [`Error::Conflict`]; with no
/// lease out, the newcomer's number replaces the recorded one.
///
/// Cancel safety: safe; a dropped or failed acquire deletes its mutex node and
/// its lease node.
#[tracing::instrument(name = "zookeeper.semaphore", skip_all, fields(%base, permits))]
pub(crate) async fn semaphore(
    session: &Arc<Session>,
    name: &str,
    base: &str,
    permits: u32,
    data: &[u8],
    wait: Wait,
) -> Result<Option<(Node, Pending)>> {
    let locks = layout::child_path(base, layout::SEMAPHORE_LOCKS);
    let leases = layout::child_path(base, layout::SEMAPHORE_LEASES);
    let out = check_permits(session, name, base, &leases, permits, false).await?;
    if wait == Wait::No && out >= permits as usize {
        return Ok(None);
    }
    let Some((_, mutex)) = queue(session, &locks, Mode::Exclusive, data, wait, false).await? else {
        return Ok(None);
    };
    if let Err(error) = check_permits(session, name, base, &leases, permits, true).await {
        mutex.abandon().await?;
        return Err(error);
    }
    let mut lease = Pending::new(session, &leases, layout::LEASE_NAME);
    let (mut node, _) = lease.create(data).await?;
    loop {
        let (children, watcher) = session
            .retry(|| session.client.get_and_watch_children(&leases))
            .await
            .map(|(children, _, watcher)| (children, watcher))
            .map_err(|e| zk_error("listing leases", e))?;
        if !children.iter().any(|c| c == lease.node()) {
            if session.is_over() {
                return Err(zk_error("waiting for a lease", zk::Error::SessionExpired));
            }
            tracing::warn!(path = %node.path, "our lease node vanished; creating it again");
            lease.reset();
            (node, _) = lease.create(data).await?;
            continue;
        }
        if children.len() <= permits as usize {
            break;
        }
        if wait == Wait::No {
            lease.abandon().await?;
            mutex.abandon().await?;
            return Ok(None);
        }
        let mut states = session.client.state_watcher();
        tokio::select! {
            _ = watcher.changed() => {}
            _ = states.changed() => {}
        }
    }
    mutex.abandon().await?;
    Ok(Some((node, lease)))
}

/// Checks (and with `record`, records) the permits of a semaphore. Returns
/// how many leases are out.
///
/// Cancel safety: safe; the record is one conditional write.
async fn check_permits(
    session: &Session,
    name: &str,
    base: &str,
    leases: &str,
    permits: u32,
    record: bool,
) -> Result<usize> {
    loop {
        let read = session.client.get_data(base);
        let listed = session.client.list_children(leases);
        let (read, listed) = tokio::join!(read, listed);
        let out = match listed {
            Ok(children) => children.len(),
            Err(zk::Error::NoNode) => 0,
            Err(error) => return Err(zk_error("listing leases", error)),
        };
        let (data, version) = match read {
            Ok((data, stat)) => (data, Some(stat.version)),
            Err(zk::Error::NoNode) if !record => return Ok(out),
            Err(error) => return Err(zk_error("reading the semaphore", error)),
        };
        let recorded = layout::parse_permits(&data);
        if recorded == Some(permits) {
            return Ok(out);
        }
        if let Some(recorded) = recorded {
            if out > 0 {
                return Err(Error::Conflict {
                    name: name.to_owned(),
                    mode: Mode::Semaphore { permits },
                    detail: format!(
                        "the semaphore has {recorded} permits ({out} taken), not {permits}"
                    ),
                });
            }
        }
        if !record {
            return Ok(out);
        }
        let text = permits.to_string();
        match session
            .client
            .set_data(base, text.as_bytes(), version)
            .await
        {
            Ok(_) => return Ok(out),
            Err(zk::Error::BadVersion | zk::Error::ConnectionLoss) => continue,
            Err(error) => return Err(zk_error("recording the permits", error)),
        }
    }
}
