//! Inspection and administration: reading a lock path back as holders and
//! waiters, walking a tree of locks, force-releasing.

use std::time::{Duration, SystemTime};

use futures::future::join_all;
use locksmith_core::Mode;
use zookeeper_client as zk;

use super::acquire::zk_error;
use super::hold::HoldTable;
use super::layout;
use super::session::Session;
use crate::backend::{Holder, LockInfo, Waiter};
use crate::error::Result;

/// What inspection needs besides the session.
pub(crate) struct View<'a> {
    pub session: &'a Session,
    pub holds: &'a HoldTable,
    /// `lock_by` of this client's own nodes.
    pub lock_by: &'a str,
}

/// A contender as read from its node.
struct Contender {
    node: String,
    path: String,
    owner: String,
    stat: zk::Stat,
}

impl View<'_> {
    /// Describes the lock at `name`, from the children of its path.
    ///
    /// Cancel safety: safe, read-only.
    pub async fn describe(&self, name: &str) -> Result<Option<LockInfo>> {
        let path = layout::lock_path(name);
        let children = self
            .session
            .children(&path)
            .await
            .map_err(|e| zk_error("listing the lock path", e))?;
        self.describe_children(name, &path, &children).await
    }

    /// Describes a lock whose path has `children`. A semaphore is recognised by
    /// its `leases` child, anything else is a contender queue.
    ///
    /// Cancel safety: safe, read-only.
    async fn describe_children(
        &self,
        name: &str,
        path: &str,
        children: &[String],
    ) -> Result<Option<LockInfo>> {
        if children.iter().any(|c| c == layout::SEMAPHORE_LEASES) {
            return self.describe_semaphore(name, path).await;
        }
        let queue = layout::contenders(children);
        if queue.is_empty() {
            return Ok(None);
        }
        let holding = layout::holders_in(&queue);
        let read = self.read(path, &queue).await?;
        let mut info = LockInfo {
            name: name.to_owned(),
            holders: Vec::new(),
            waiters: Vec::new(),
        };
        for contender in read {
            let position = queue.iter().position(|c| *c == contender.node);
            let mode = if layout::is_reader(&contender.node) {
                Mode::Shared
            } else {
                Mode::Exclusive
            };
            if position.is_some_and(|p| p < holding) {
                info.holders.push(self.holder(&contender, mode));
            } else {
                info.waiters.push(waiter(&contender, mode));
            }
        }
        Ok((!info.holders.is_empty() || !info.waiters.is_empty()).then_some(info))
    }

    /// A semaphore: the lease nodes hold, the mutex queue waits.
    ///
    /// Cancel safety: safe, read-only.
    async fn describe_semaphore(&self, name: &str, path: &str) -> Result<Option<LockInfo>> {
        let session = self.session;
        let locks = layout::child_path(path, layout::SEMAPHORE_LOCKS);
        let leases = layout::child_path(path, layout::SEMAPHORE_LEASES);
        let (data, lease_nodes, lock_nodes) = tokio::join!(
            session.client.get_data(path),
            session.children(&leases),
            session.children(&locks)
        );
        let recorded = data.ok().and_then(|(data, _)| layout::parse_permits(&data));
        let lease_nodes = lease_nodes.map_err(|e| zk_error("listing leases", e))?;
        let lock_nodes = lock_nodes.map_err(|e| zk_error("listing the semaphore queue", e))?;
        let leased = self
            .read(&leases, &layout::contenders(&lease_nodes))
            .await?;
        let queued = self.read(&locks, &layout::contenders(&lock_nodes)).await?;
        let permits = recorded.unwrap_or(leased.len().max(1) as u32);
        let mode = Mode::Semaphore { permits };
        let holders: Vec<Holder> = leased.iter().map(|c| self.holder(c, mode)).collect();
        // A client that already has its lease still holds the mutex for a moment.
        let waiters: Vec<Waiter> = queued
            .iter()
            .filter(|q| {
                !leased
                    .iter()
                    .any(|l| l.owner == q.owner && l.stat.ephemeral_owner == q.stat.ephemeral_owner)
            })
            .map(|c| waiter(c, mode))
            .collect();
        if holders.is_empty() && waiters.is_empty() {
            return Ok(None);
        }
        Ok(Some(LockInfo {
            name: name.to_owned(),
            holders,
            waiters,
        }))
    }

    /// Reads the nodes of `dir` named in `nodes` (pipelined), skipping those
    /// that vanished meanwhile.
    ///
    /// Cancel safety: safe, read-only.
    async fn read(&self, dir: &str, nodes: &[&str]) -> Result<Vec<Contender>> {
        let paths: Vec<String> = nodes.iter().map(|n| layout::child_path(dir, n)).collect();
        let reads = join_all(paths.iter().map(|p| self.session.client.get_data(p))).await;
        let mut out = Vec::with_capacity(nodes.len());
        for ((node, path), read) in nodes.iter().zip(paths).zip(reads) {
            match read {
                Ok((data, stat)) => out.push(Contender {
                    node: (*node).to_owned(),
                    path,
                    owner: String::from_utf8_lossy(&data).into_owned(),
                    stat,
                }),
                Err(zk::Error::NoNode) => {}
                Err(error) => return Err(zk_error("reading a contender", error)),
            }
        }
        Ok(out)
    }

    fn holder(&self, contender: &Contender, mode: Mode) -> Holder {
        let ours = (contender.stat.ephemeral_owner == self.session.id)
            .then(|| self.holds.by_path(&contender.path))
            .flatten();
        Holder {
            owner: contender.owner.clone(),
            lock_by: Some(self.lock_by(contender.stat.ephemeral_owner)),
            lock_time: Some(
                ours.as_ref()
                    .map_or_else(|| wall_clock(contender.stat.ctime), |h| h.granted_at),
            ),
            fencing_token: Some(contender.stat.czxid as u64),
            lease_expires: ours.as_ref().and_then(|h| h.lease_expires()),
            mode,
            hold_count: ours.as_ref().map_or(1, |h| h.count()),
        }
    }

    /// `lock_by` of a node: this client's name for its own nodes, otherwise
    /// the session that owns the node (all ZooKeeper records about a client).
    fn lock_by(&self, session: i64) -> String {
        if session == self.session.id {
            format!("{} (session {session:#x})", self.lock_by)
        } else {
            format!("session {session:#x}")
        }
    }

    /// Every lock whose name starts with `prefix`, walking the tree below the
    /// deepest path the prefix names in full.
    ///
    /// Cancel safety: safe, read-only.
    pub async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        let (parent, leaf) = prefix.rsplit_once('/').unwrap_or(("", prefix));
        let start = if parent.is_empty() {
            "/".to_owned()
        } else {
            layout::lock_path(parent)
        };
        let mut found = Vec::new();
        // (name so far, path, leaf filter)
        let mut stack = vec![(parent.to_owned(), start, Some(leaf))];
        while let Some((base, path, filter)) = stack.pop() {
            let children = self
                .session
                .children(&path)
                .await
                .map_err(|e| zk_error("walking the lock tree", e))?;
            for child in children {
                if layout::sequence(&child).is_some()
                    || filter.is_some_and(|f| !child.starts_with(f))
                    || (path == "/" && child == "zookeeper" && self.session.client.path() == "/")
                {
                    continue;
                }
                let name = if base.is_empty() {
                    child.clone()
                } else {
                    format!("{base}/{child}")
                };
                let child_path = layout::child_path(&path, &child);
                let grandchildren = self
                    .session
                    .children(&child_path)
                    .await
                    .map_err(|e| zk_error("walking the lock tree", e))?;
                if let Some(info) = self
                    .describe_children(&name, &child_path, &grandchildren)
                    .await?
                {
                    found.push(info);
                }
                let is_semaphore = grandchildren.iter().any(|c| c == layout::SEMAPHORE_LEASES);
                let has_subtree = grandchildren.iter().any(|c| layout::sequence(c).is_none());
                if !is_semaphore && has_subtree {
                    stack.push((name, child_path, None));
                }
            }
        }
        found.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(found)
    }

    /// Deletes every contender of a lock (and every lease and queued entrant of
    /// a semaphore), whoever owns them. Their holders see their node deleted
    /// and report the hold lost.
    ///
    /// Cancel safety: some nodes may have been deleted.
    pub async fn force_release(&self, name: &str) -> Result<()> {
        let path = layout::lock_path(name);
        let children = self
            .session
            .children(&path)
            .await
            .map_err(|e| zk_error("listing the lock path", e))?;
        let mut dirs = vec![path.clone()];
        if children.iter().any(|c| c == layout::SEMAPHORE_LEASES) {
            dirs.push(layout::child_path(&path, layout::SEMAPHORE_LEASES));
            dirs.push(layout::child_path(&path, layout::SEMAPHORE_LOCKS));
        }
        for dir in dirs {
            let nodes = self
                .session
                .children(&dir)
                .await
                .map_err(|e| zk_error("listing contenders", e))?;
            let paths: Vec<String> = layout::contenders(&nodes)
                .into_iter()
                .map(|n| layout::child_path(&dir, n))
                .collect();
            for result in join_all(paths.iter().map(|p| self.session.delete(p))).await {
                result.map_err(|e| zk_error("deleting a contender", e))?;
            }
            tracing::info!(%dir, deleted = paths.len(), "force-released");
        }
        Ok(())
    }
}

fn waiter(contender: &Contender, mode: Mode) -> Waiter {
    Waiter {
        owner: contender.owner.clone(),
        mode,
        since: Some(wall_clock(contender.stat.ctime)),
    }
}

fn wall_clock(millis: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(millis.max(0) as u64)
}
