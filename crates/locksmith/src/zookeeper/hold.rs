//! Live holds: the client-side table (inspection, leases) and the task that
//! watches each hold's node.
//!
//! Re-entry is the model layer's (client-local, as in Curator's
//! `InterProcessMutex` and its `threadData` map): one node per hold, whose
//! depth the table keeps for inspection.
//!
//! Each hold has one task that watches its own node (an `exists` watch), so that
//! [`LostSignal`] fires when the node disappears without our release (an
//! administrator's `force_release`, a `delete` from another client), when the
//! session's trust signal fires (expiry, suspension past the grace), or when a
//! fixed lease ends.
//!
//! **Leases are enforced by this client.** ZooKeeper has no TTL for ephemeral
//! nodes (TTL nodes exist only for persistent nodes, need
//! `extendedTypesEnabled`, and are reaped by the container manager on its own
//! schedule, typically once a minute), so a hold with a lease is an ephemeral
//! node that this client deletes when the lease ends, firing `lost()` at the
//! same moment; `extend` moves that deadline. If the client dies first, the
//! session's expiry removes the node anyway: a hold never outlives
//! `min(lease, session)`.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use zookeeper_client as zk;

use super::acquire::zk_error;
use super::session::Session;
use super::BACKEND;
use crate::backend::{Hold, LostSignal};
use crate::error::{Error, Loss, Result};
use crate::keeper::{self, Kept, Term};
use crate::lost::LostCause;

/// Holds of one client by `(lock name, owner)`, for inspection, elections
/// and closing.
#[derive(Default)]
pub(crate) struct HoldTable {
    holds: Mutex<HashMap<(String, String), Arc<HoldState>>>,
}

impl HoldTable {
    /// Our live hold whose node is `path`, if any.
    pub fn by_path(&self, path: &str) -> Option<Arc<HoldState>> {
        self.lock().values().find(|h| h.path == path).cloned()
    }

    /// Records a new hold (replacing a stale entry of the same owner).
    pub fn insert(&self, hold: Arc<HoldState>) {
        self.lock()
            .insert((hold.name.clone(), hold.owner.clone()), hold);
    }

    /// Takes every hold out of the table (closing the client).
    pub fn drain(&self) -> Vec<Arc<HoldState>> {
        self.lock().drain().map(|(_, h)| h).collect()
    }

    fn remove(&self, hold: &Arc<HoldState>) {
        let mut holds = self.lock();
        let key = (hold.name.clone(), hold.owner.clone());
        if holds.get(&key).is_some_and(|h| Arc::ptr_eq(h, hold)) {
            holds.remove(&key);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Arc<HoldState>>> {
        self.holds.lock().expect("hold table lock")
    }
}

/// One hold: one node of ours.
pub(crate) struct HoldState {
    /// Lock name.
    pub name: String,
    /// Owner id as given by the acquiring client.
    pub owner: String,
    /// Full path of our node (a lock contender or a semaphore lease).
    pub path: String,
    /// The fencing token: the node's czxid.
    pub token: u64,
    /// Fires when the hold can no longer be trusted.
    pub lost: LostSignal,
    /// When it was granted.
    pub granted_at: SystemTime,
    /// The session the node belongs to.
    pub session: Arc<Session>,
    /// The version of the node's data, for an election's checked `setData`.
    pub data_version: std::sync::atomic::AtomicI32,
    inner: Mutex<Inner>,
    done: CancellationToken,
    /// The keeper's term of a leased hold: when this client ends it.
    lease: Option<watch::Sender<Term>>,
}

struct Inner {
    /// Re-entry depth, as the model layer records it.
    count: u32,
    status: Status,
    /// When a leased hold's lease runs out, for inspection.
    lease_expires: Option<SystemTime>,
}

enum Status {
    Held,
    Released,
    Lost(String),
}

/// What a grant needs to become a hold.
pub(crate) struct NewHold {
    pub name: String,
    pub owner: String,
    pub path: String,
    pub token: u64,
    pub lease: Option<Duration>,
    pub session: Arc<Session>,
    /// The session's trust signal as it was when the node was created.
    pub trust: LostSignal,
}

impl HoldState {
    /// Makes the hold, records it, and starts its watch task.
    pub fn start(new: NewHold, table: &Arc<HoldTable>) -> Arc<HoldState> {
        let hold = Arc::new(HoldState {
            name: new.name,
            owner: new.owner,
            path: new.path,
            token: new.token,
            lost: LostSignal::new(),
            granted_at: SystemTime::now(),
            session: new.session,
            data_version: std::sync::atomic::AtomicI32::new(0),
            inner: Mutex::new(Inner {
                count: 1,
                status: Status::Held,
                lease_expires: new.lease.map(|lease| SystemTime::now() + lease),
            }),
            done: CancellationToken::new(),
            lease: new.lease.map(|lease| {
                watch::Sender::new(Term::fixed("the hold", Kept::Hold, Instant::now(), lease))
            }),
        });
        table.insert(hold.clone());
        tokio::spawn(watch(hold.clone(), table.clone(), new.trust));
        hold
    }

    /// Re-entry depth.
    pub fn count(&self) -> u32 {
        self.inner().count
    }

    /// When the lease runs out, for a leased hold.
    pub fn lease_expires(&self) -> Option<SystemTime> {
        self.inner().lease_expires
    }

    /// Marks the hold lost (if it was held) and fires its signal. Returns
    /// whether this call did it.
    pub fn lose(self: &Arc<Self>, table: &HoldTable, cause: LostCause, reason: &str) -> bool {
        {
            let mut inner = self.inner();
            if !matches!(inner.status, Status::Held) {
                return false;
            }
            inner.status = Status::Lost(reason.to_owned());
        }
        table.remove(self);
        self.done.cancel();
        tracing::warn!(lock = %self.name, owner = %self.owner, token = self.token, %reason, "hold lost");
        self.lost
            .fire_because(cause, format!("{}: {reason}", self.name));
        true
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("hold lock")
    }

    /// [`Error::Lost`] for `reason`, with the cause the signal fired with
    /// (none where the release itself found the hold gone).
    fn lost_error(&self, reason: &str) -> Error {
        Error::Lost(Loss {
            reason: format!("{}: {reason}", self.name),
            cause: self.lost.cause(),
        })
    }
}

/// Watches one hold until it is released or lost.
///
/// Cancel safety: runs as its own task; aborting it only stops the watching.
async fn watch(hold: Arc<HoldState>, table: Arc<HoldTable>, trust: LostSignal) {
    let node_gone = node_gone(&hold);
    let lease_ran_out = async {
        match &hold.lease {
            Some(term) => keeper::keep_fixed(term.clone()).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = hold.done.cancelled() => {}
        reason = trust.fired() => {
            let cause = trust.cause().unwrap_or_default();
            if hold.lose(&table, cause, &reason) {
                delete_abandoned(&hold).await;
            }
        }
        loss = lease_ran_out => {
            if hold.lose(&table, loss.cause, &loss.reason) {
                delete_abandoned(&hold).await;
            }
        }
        (cause, reason, still_there) = node_gone => {
            if hold.lose(&table, cause, &reason) && still_there {
                delete_abandoned(&hold).await;
            }
        }
    }
}

/// Completes when our node stops being ours: why (in a word and in words),
/// and whether the node may still exist.
///
/// Cancel safety: safe; dropping it drops the watch.
async fn node_gone(hold: &HoldState) -> (LostCause, String, bool) {
    let session = &hold.session;
    loop {
        let watcher = match session
            .retry(|| session.client.check_and_watch_stat(&hold.path))
            .await
        {
            Ok((Some(_), watcher)) => watcher,
            Ok((None, _)) | Err(zk::Error::NoNode) => {
                return (LostCause::Gone, "its node is gone".into(), false)
            }
            Err(error) => {
                let reason = format!("cannot watch its node: {error}");
                return (LostCause::ConnectionLost, reason, true);
            }
        };
        let event = watcher.changed().await;
        match event.event_type {
            zk::EventType::NodeDeleted => {
                return (
                    LostCause::Gone,
                    "its node was deleted (a force-release, or its session ended)".into(),
                    false,
                )
            }
            zk::EventType::Session => {
                let cause = match event.session_state {
                    zk::SessionState::Expired => LostCause::SessionExpired,
                    zk::SessionState::Closed => LostCause::SessionClosed,
                    _ => LostCause::Other,
                };
                let reason = format!("ZooKeeper session ended ({:?})", event.session_state);
                return (cause, reason, false);
            }
            // The data changed: watch again.
            _ => {}
        }
    }
}

/// Deletes the node of a hold that was lost while its node may still exist
/// (lease ended, connection suspended too long), so the next contender gets the
/// lock. Waits for a reconnection if need be; gives up when the session ends
/// (the server then deletes the node itself).
///
/// Cancel safety: the delete may or may not have happened.
async fn delete_abandoned(hold: &HoldState) {
    if let Err(error) = hold.session.delete(&hold.path).await {
        tracing::debug!(path = %hold.path, %error, "abandoned node not deleted; the session ends it");
    }
}

/// A guard's handle on a hold.
pub(crate) struct ZkHold {
    pub hold: Arc<HoldState>,
    pub table: Arc<HoldTable>,
}

#[async_trait]
impl Hold for ZkHold {
    /// Deletes the node.
    ///
    /// Cancel safety: if dropped midway, the delete may or may not have
    /// happened; the session ends the node in any case.
    #[tracing::instrument(name = "zookeeper.release", skip_all, fields(lock = %self.hold.name, token = self.hold.token))]
    async fn release(self: Box<Self>) -> Result<()> {
        let hold = &self.hold;
        {
            let mut inner = hold.inner();
            match &inner.status {
                Status::Lost(reason) => return Err(hold.lost_error(reason)),
                Status::Released => {
                    return Err(Error::NotHeld {
                        name: hold.name.clone(),
                    })
                }
                Status::Held => {}
            }
            inner.status = Status::Released;
        }
        self.table.remove(hold);
        hold.done.cancel();
        match hold.session.delete(&hold.path).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(hold.lost_error("its node was already gone")),
            Err(error) if hold.session.is_over() => {
                Err(hold.lost_error(&format!("ZooKeeper session ended ({error})")))
            }
            Err(error) => {
                // The session lives on, and so would the node, in front of
                // every waiter: keep trying in the background.
                let hold = hold.clone();
                tokio::spawn(async move { delete_abandoned(&hold).await });
                Err(Error::backend(BACKEND, error))
            }
        }
    }

    /// Moves the lease's end to `lease` from now, after checking that the node
    /// is still ours.
    ///
    /// Cancel safety: safe; the extension either happened or did not.
    #[tracing::instrument(name = "zookeeper.extend", skip_all, fields(lock = %self.hold.name, ?lease))]
    async fn extend(&self, lease: Duration) -> Result<()> {
        let hold = &self.hold;
        if let Status::Lost(reason) = &hold.inner().status {
            return Err(hold.lost_error(reason));
        }
        let session = &hold.session;
        let stat = session
            .retry(|| session.client.check_stat(&hold.path))
            .await
            .map_err(|e| Error::backend(BACKEND, e))?;
        if stat.is_none_or(|s| s.ephemeral_owner != session.id) {
            hold.lose(&self.table, LostCause::Gone, "its node is gone");
        }
        let mut inner = hold.inner();
        match &inner.status {
            Status::Held => {
                inner.lease_expires = Some(SystemTime::now() + lease);
                drop(inner);
                if let Some(term) = &hold.lease {
                    term.send_modify(|term| term.extended(Instant::now(), lease));
                }
                Ok(())
            }
            Status::Lost(reason) => Err(hold.lost_error(reason)),
            Status::Released => Err(Error::NotHeld {
                name: hold.name.clone(),
            }),
        }
    }

    /// Keeps the depth for inspection (the node does not record it).
    ///
    /// Cancel safety: safe; nothing to wait for.
    async fn record_count(&self, count: u32) -> Result<()> {
        self.hold.inner().count = count;
        Ok(())
    }

    /// Replaces the leader's value: `setData` on our node with the version we
    /// last wrote, so it lands only on our node as we left it. A node that is
    /// gone or was changed by someone else loses the hold.
    ///
    /// Cancel safety: safe; the new data either landed or did not.
    async fn proclaim(&self, value: &str) -> Result<()> {
        let hold = &self.hold;
        let session = &hold.session;
        let version = hold.data_version.load(Ordering::SeqCst);
        let written = session
            .retry(|| {
                session
                    .client
                    .set_data(&hold.path, value.as_bytes(), Some(version))
            })
            .await;
        let why = match written {
            Ok(stat) => {
                hold.data_version.store(stat.version, Ordering::SeqCst);
                return Ok(());
            }
            Err(zk::Error::NoNode) => "its node is gone",
            Err(zk::Error::BadVersion) => "its node was changed by another client",
            Err(error) => return Err(zk_error("proclaiming a new value", error)),
        };
        hold.lose(&self.table, LostCause::Gone, why);
        Err(Error::Lost(Loss::because(
            LostCause::Gone,
            format!("{}: {why}", hold.name),
        )))
    }
}
