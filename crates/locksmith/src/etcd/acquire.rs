//! Acquiring: enqueue a key, then wait for the deletes in front of it.
//!
//! The exclusive path is etcd's `concurrency.Mutex.Lock` step for step
//! (`client/v3/concurrency/mutex.go` and `key.go`):
//!
//! 1. `tryAcquire`: one transaction
//!    `If(CreateRevision(key) == 0).Then(Put(key, v, WithLease), Get(pfx, WithFirstCreate)).Else(Get(key), Get(pfx, WithFirstCreate))`;
//!    our revision is the header revision (or the existing key's create revision).
//! 2. Owner when the first creator is our key (`TryLock` stops here otherwise,
//!    deleting the key).
//! 3. `waitDeletes`: get the last-created key with create revision `<= ours - 1`,
//!    watch it for a `DELETE`, repeat until none is left.
//! 4. Re-read our own key and fail when it is gone (the session expired while
//!    waiting: etcd #11408, found by Jepsen).
//!
//! Where we differ, it is to be faster without changing what is decided:
//!
//! - Steps 3 and 4 are one range read: the two newest keys with create
//!   revision `<= ours` are ours (or it is gone) and the one we queue behind.
//!   Go needs two round trips after every wake-up; we need one.
//! - After a wake-up by a delete at revision `D`, that read is serializable
//!   when its answer reflects at least `D` (else it is repeated
//!   linearizably): every committed state from `D` on proves the same.
//! - The watch starts at etcd's *current* revision instead of the read's, so
//!   etcd puts it in its synced group at once; Go's watch from the read's
//!   revision usually lands in the unsynced group, whose catch-up loop runs
//!   every 100 ms and stalls a handoff that comes soon after. The gap between
//!   our read and the watch's start is closed by one check when etcd reports
//!   the watch created at a later revision.
//!
//! Shared and semaphore contenders read the whole prefix instead of one key
//! and apply [`standing`]; the waiting is the same.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::Instrument;

use super::hold::{delete_until_done, refresh, Entry, EntryState, EtcdHold, HoldLease, OwnLease};
use super::layout::{
    classify, contenders, hold_key, key_value, lock_prefix, now_ms, permit_mismatch, standing,
    Meta, Standing,
};
use super::rpc::etcdserverpb::range_request::SortOrder;
use super::rpc::etcdserverpb::{RangeRequest, RangeResponse, TxnRequest};
use super::rpc::{self, by_create, revision};
use super::session::{ttl_seconds, Session};
use super::watch::{Deferrable, Sink, Wake};
use super::{backend_error, cleanups, Inner, BACKEND};
use crate::backend::LostSignal;
use crate::backend::{AcquireRequest, Grant, Mode, Wait};
use crate::error::{Error, Result};
use crate::lost::LostCause;

/// What a queued key is attached to.
#[derive(Clone)]
enum QueueLease {
    Session(Arc<Session>),
    Own(Arc<OwnLease>),
}

impl QueueLease {
    fn id(&self) -> i64 {
        match self {
            QueueLease::Session(session) => session.id,
            QueueLease::Own(own) => own.id(),
        }
    }
}

/// Our queue entry until it becomes a hold. Dropped while armed (the acquire
/// was cancelled, timed out or failed), it deletes the key in the background.
struct Pending {
    inner: Arc<Inner>,
    key: String,
    lease: QueueLease,
    armed: bool,
}

impl Pending {
    /// Deletes the key now (a busy `try_acquire`, a conflict).
    ///
    /// Cancel safety: if dropped midway the key may stay; it ends with its lease.
    async fn remove(mut self) {
        self.armed = false;
        remove(self.inner.clone(), self.key.clone(), self.lease.clone()).await;
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (inner, key, lease) = (self.inner.clone(), self.key.clone(), self.lease.clone());
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // No runtime: the key ends with its lease.
        };
        let done = cleanups::begin(&key);
        runtime.spawn(async move {
            remove(inner, key, lease).await;
            done.finish();
        });
    }
}

/// Deletes a queue entry: the key on the session lease, or the whole lease of
/// a leased acquire (which deletes its key; should the revoke fail, the
/// lease still runs out).
///
/// Cancel safety: if dropped midway the key may stay; it ends with its lease.
async fn remove(inner: Arc<Inner>, key: String, lease: QueueLease) {
    match lease {
        // Retried until it lands: an abandoned key would block every later
        // waiter for as long as our session lives.
        QueueLease::Session(session) => delete_until_done(&inner, &key, &session).await,
        QueueLease::Own(own) => {
            own.stop();
            let _ = inner.client.revoke_lease(own.id()).await;
        }
    }
}

/// Pause before reading the queue again after a failed read.
const RETRY: Duration = Duration::from_millis(200);

/// Why one enqueue attempt failed.
enum Attempt {
    Failed(Error),
    /// The session lease was gone when we put our key (a retry may work).
    StaleSession,
}

impl From<Error> for Attempt {
    fn from(error: Error) -> Self {
        Attempt::Failed(error)
    }
}

/// etcd's answer to a put on a lease that no longer exists.
fn lease_not_found(error: &tonic::Status) -> bool {
    error.message().contains("lease not found")
}

/// Where we stand, as of a read at `revision`.
struct View {
    standing: Standing,
    revision: i64,
    /// Keys under the prefix created before ours (any kind), when known.
    earlier: usize,
}

/// What a waiter waits for.
#[derive(Debug)]
enum Blocked {
    /// The delete of this key (created at `revision`).
    Key { key: String, revision: i64 },
    /// Any delete among the `count` keys created before ours.
    Earlier { count: usize },
}

impl Inner {
    /// Acquires one name (re-entries excluded). See the module docs.
    ///
    /// Cancel safety: safe; a dropped acquire deletes its queue key in the
    /// background (see `Pending`).
    pub(crate) async fn acquire_one(
        self: &Arc<Self>,
        name: &str,
        request: &AcquireRequest,
    ) -> Result<Option<Grant>> {
        match self.attempt(name, request).await {
            Ok(grant) => Ok(grant),
            Err(Attempt::Failed(error)) => Err(error),
            // The session lease vanished before its keep-alive noticed: once
            // more on a fresh session.
            Err(Attempt::StaleSession) => match self.attempt(name, request).await {
                Ok(grant) => Ok(grant),
                Err(Attempt::Failed(error)) => Err(error),
                Err(Attempt::StaleSession) => Err(Error::Lost(
                    "the session lease vanished twice while enqueueing".into(),
                )),
            },
        }
    }

    /// One enqueue-and-wait; [`Attempt::StaleSession`] when the session lease
    /// turned out to be gone.
    ///
    /// Cancel safety: safe, as for [`Inner::acquire_one`].
    async fn attempt(
        self: &Arc<Self>,
        name: &str,
        request: &AcquireRequest,
    ) -> std::result::Result<Option<Grant>, Attempt> {
        let mode = request.mode;
        let prefix = lock_prefix(&self.namespace, name);
        let (lease, key) = match request.lease {
            None => {
                let session = self.session().await?;
                let key = session.allocate_key(hold_key(&prefix, mode, session.id));
                (QueueLease::Session(session), key)
            }
            Some(duration) => {
                let sent = Instant::now();
                let granted = self
                    .client
                    .grant_lease(ttl_seconds(duration))
                    .await
                    .map_err(|e| backend_error("granting the hold's lease", e))?;
                let own = OwnLease::new(granted.id, granted.ttl, sent, duration);
                let key = hold_key(&prefix, mode, granted.id);
                (QueueLease::Own(own), key)
            }
        };
        let span = tracing::debug_span!("enqueue", backend = BACKEND, %key);
        let pending = Pending {
            inner: self.clone(),
            key: key.clone(),
            lease: lease.clone(),
            armed: true,
        };
        let meta = Meta {
            name: name.to_owned(),
            owner: request.owner.clone(),
            mode,
            lock_by: self.lock_by.clone(),
            since_ms: now_ms(),
            count: 1,
        };
        async move {
            // tryAcquire (mutex.go), with the whole queue for shared/semaphore.
            let first = RangeRequest {
                limit: i64::from(mode == Mode::Exclusive),
                ..by_create(&prefix, SortOrder::Ascend)
            };
            let txn = TxnRequest {
                compare: vec![rpc::create_revision_is(key.clone(), 0)],
                success: vec![
                    rpc::put(key.clone(), key_value(&meta, request.published.as_deref()), lease.id()).into(),
                    first.clone().into(),
                ],
                failure: vec![rpc::get(key.clone()).into(), first.into()],
            };
            // Create-if-absent: sent again if a member goes down under it,
            // a retry that finds the key reuses it (below).
            let response = match self.client.txn_repeatable(txn).await {
                Ok(response) => response,
                Err(error) => {
                    if let (true, QueueLease::Session(session)) = (lease_not_found(&error), &lease) {
                        session.end(
                            LostCause::SessionExpired,
                            "the session lease expired or was revoked",
                        );
                        Box::pin(pending.remove()).await;
                        return Err(Attempt::StaleSession);
                    }
                    return Err(backend_error("enqueueing the lock key", error).into());
                }
            };
            let at = revision(response.header.as_ref());
            let succeeded = response.succeeded;
            let mut reads = rpc::read_results(response);
            let mine = if succeeded {
                at
            } else {
                tracing::debug!(backend = BACKEND, %key, "key existed: reusing it, as mutex.go does");
                reads[0]
                    .first()
                    .map(|kv| kv.create_revision)
                    .ok_or_else(|| Error::Lost(format!("{key} vanished while enqueueing").into()))?
            };
            let queue = std::mem::take(&mut reads[1]);
            let mut view = if mode == Mode::Exclusive {
                match queue.first() {
                    Some(first) if first.create_revision == mine => Some(View {
                        standing: Standing::Holds,
                        revision: at,
                        earlier: 0,
                    }),
                    // Someone queued first: `TryLock` gives up here.
                    Some(first) if classify(&prefix, name, first).is_some() && request.wait == Wait::No => {
                        Box::pin(pending.remove()).await;
                        return Ok(None);
                    }
                    _ => None,
                }
            } else {
                let all = contenders(&prefix, name, &queue);
                if let Mode::Semaphore { permits } = mode {
                    if let Some(existing) = permit_mismatch(&all, permits) {
                        Box::pin(pending.remove()).await;
                        return Err(Attempt::Failed(Error::Conflict {
                            name: name.to_owned(),
                            mode,
                            detail: format!("the semaphore has {existing} permits, not {permits}"),
                        }));
                    }
                }
                Some(View {
                    standing: standing(&all, mine, mode),
                    revision: at,
                    earlier: queue.iter().filter(|kv| kv.create_revision < mine).count(),
                })
            };
            // waitDeletes (key.go), re-checking our own key at every step.
            let mut waited = false;
            let mut seen = None;
            let granted_at = loop {
                let current = match view.take() {
                    Some(current) => current,
                    // Boxed: the uncontended path never pays for the waiting path's state.
                    None => match Box::pin(self.read_view(&prefix, name, &key, mine, mode, seen)).await {
                        Ok(current) => current,
                        // etcd unreachable for a moment (a restart, a leader
                        // change): keep our place and read again, for as long
                        // as our lease lives.
                        Err(error @ Error::Backend { .. }) => {
                            tracing::debug!(backend = BACKEND, %key, %error, "reading the queue failed; retrying");
                            Box::pin(self.pause(&lease)).await?;
                            seen = None;
                            continue;
                        }
                        Err(error) => return Err(error.into()),
                    },
                };
                let blocked = match current.standing {
                    Standing::Holds => break current.revision,
                    _ if request.wait == Wait::No => {
                        Box::pin(pending.remove()).await;
                        return Ok(None);
                    }
                    Standing::WaitFor { key, revision } => Blocked::Key { key, revision },
                    Standing::WaitForAny => Blocked::Earlier {
                        count: current.earlier,
                    },
                };
                tracing::trace!(backend = BACKEND, %key, ?blocked, "waiting for a delete");
                let (sender, mut events) = mpsc::unbounded_channel();
                let _watch = match &blocked {
                    Blocked::Key { key, .. } => self.hub.watch(key.clone(), None, 0, Sink::Wake(sender)),
                    Blocked::Earlier { .. } => {
                        let (start, end) = rpc::prefix_range(prefix.as_bytes());
                        self.hub.watch(start, Some(end), 0, Sink::Wake(sender))
                    }
                };
                seen = Box::pin(self.wait(&lease, &mut events, &blocked, &prefix, mine, current.revision))
                    .await?;
                waited = true;
            };
            if let (true, QueueLease::Own(own), Some(duration)) = (waited, &lease, request.lease) {
                // The hold's lease starts now, not when it queued.
                let sent = Instant::now();
                if !Box::pin(refresh(&self.client, own.id())).await? {
                    return Err(Error::Lost("the lease of the waiting acquire is gone".into()).into());
                }
                own.term.send_modify(|term| term.extended(sent, duration));
            }
            Ok(self.grant(name, request, key.clone(), mine, granted_at, lease, meta, pending)?)
        }
        .instrument(span)
        .await
    }

    /// Sleeps until what blocks us is deleted, keeping a leased acquire's own
    /// lease alive, and fails when the session ends.
    ///
    /// The watch starts at etcd's current revision (see the `watch` module);
    /// when etcd reports it created after our read at `read_at`, one read
    /// checks whether the blocker went in between.
    ///
    /// Cancel safety: safe; it only waits (and renews a lease).
    async fn wait(
        &self,
        lease: &QueueLease,
        events: &mut mpsc::UnboundedReceiver<Wake>,
        blocked: &Blocked,
        prefix: &str,
        mine: i64,
        read_at: i64,
    ) -> Result<Option<i64>> {
        let ended = async {
            match lease {
                QueueLease::Session(session) => session.ended().await,
                QueueLease::Own(_) => std::future::pending().await,
            }
        };
        tokio::pin!(ended);
        let (own, every) = match lease {
            QueueLease::Own(own) => {
                let ttl = own.state.lock().expect("own lease").ttl;
                (Some(own.id()), Duration::from_secs(ttl.max(1) as u64) / 3)
            }
            QueueLease::Session(_) => (None, Duration::from_secs(86_400)),
        };
        loop {
            tokio::select! {
                event = events.recv() => match event {
                    Some(Wake::Deleted(at)) => return Ok(Some(at)),
                    Some(Wake::Reset) => return Ok(None),
                    Some(Wake::Created(at)) if at > read_at => {
                        // An error is treated as a change: the caller re-reads.
                        if self.gone_since_read(blocked, prefix, mine).await.unwrap_or(true) {
                            return Ok(None);
                        }
                    }
                    Some(Wake::Created(_)) => {}
                    None => return Err(Error::Closed),
                },
                reason = &mut ended => return Err(Error::Lost(format!("while waiting: {reason}").into())),
                _ = tokio::time::sleep(every), if own.is_some() => {
                    let id = own.expect("checked");
                    // A failed renewal is retried at the next tick; a lease
                    // that is gone deletes our key, which the next read sees.
                    if let Ok(false) = refresh(&self.client, id).await {
                        return Err(Error::Lost("the lease of the waiting acquire is gone".into()));
                    }
                }
            }
        }
    }

    /// Whether what blocked us at our last read is gone by now.
    ///
    /// Cancel safety: safe, read-only.
    async fn gone_since_read(&self, blocked: &Blocked, prefix: &str, mine: i64) -> Result<bool> {
        let (request, expected) = match blocked {
            Blocked::Key { key, revision } => (rpc::get(key.clone()), *revision),
            Blocked::Earlier { count } => (
                RangeRequest {
                    max_create_revision: mine - 1,
                    ..rpc::prefix(prefix)
                },
                *count as i64,
            ),
        };
        let request = RangeRequest {
            keys_only: true,
            ..request
        };
        let response = self
            .client
            .range(request)
            .await
            .map_err(|e| backend_error("checking the key we wait for", e))?;
        Ok(match blocked {
            Blocked::Key { .. } => response
                .kvs
                .first()
                .is_none_or(|kv| kv.create_revision != expected),
            Blocked::Earlier { .. } => (response.kvs.len() as i64) < expected,
        })
    }

    /// A range read; serializable when `seen` is given and the answer reflects
    /// at least that revision, linearizable otherwise.
    ///
    /// Cancel safety: safe, read-only.
    async fn read(&self, request: RangeRequest, seen: Option<i64>) -> Result<RangeResponse> {
        if let Some(seen) = seen {
            let serializable = RangeRequest {
                serializable: true,
                ..request.clone()
            };
            let local = self
                .client
                .range(serializable)
                .await
                .map_err(|e| backend_error("reading the queue", e))?;
            if revision(local.header.as_ref()) >= seen {
                return Ok(local);
            }
        }
        self.client
            .range(request)
            .await
            .map_err(|e| backend_error("reading the queue", e))
    }

    /// A short pause before retrying a failed read; fails if the session
    /// ends meanwhile.
    ///
    /// Cancel safety: safe; it only waits.
    async fn pause(&self, lease: &QueueLease) -> Result<()> {
        let retry = tokio::time::sleep(RETRY);
        match lease {
            QueueLease::Session(session) => tokio::select! {
                _ = retry => Ok(()),
                reason = session.ended() => Err(Error::Lost(format!("while waiting: {reason}").into())),
            },
            QueueLease::Own(_) => {
                retry.await;
                Ok(())
            }
        }
    }

    /// One step of `waitDeletes` plus the own-key check, in one read.
    ///
    /// `seen`: a revision we know the store reached (the delete that woke
    /// us). Then a serializable read (no consensus round) will do, as long as
    /// it reflects at least that revision: any committed state at or after it
    /// proves the same things (no older contender can appear later).
    ///
    /// Cancel safety: safe, read-only.
    async fn read_view(
        &self,
        prefix: &str,
        name: &str,
        key: &str,
        mine: i64,
        mode: Mode,
        seen: Option<i64>,
    ) -> Result<View> {
        let gone = || {
            Error::Lost(
                format!(
                    "our queue key {key} vanished while waiting (its lease expired or was revoked)"
                )
                .into(),
            )
        };
        if mode == Mode::Exclusive {
            // Go's Get(pfx, WithLastCreate, WithMaxCreateRev(myRev-1)) and
            // Get(myKey) in one range: the two newest keys up to our revision
            // are ours and the one we queue behind.
            let newest = RangeRequest {
                max_create_revision: mine,
                limit: 2,
                ..by_create(prefix, SortOrder::Descend)
            };
            let response = self.read(newest, seen).await?;
            let at = revision(response.header.as_ref());
            let kvs = &response.kvs;
            if kvs
                .first()
                .is_none_or(|kv| kv.create_revision != mine || kv.key != key.as_bytes())
            {
                return Err(gone());
            }
            match kvs.get(1) {
                None => {
                    return Ok(View {
                        standing: Standing::Holds,
                        revision: at,
                        earlier: 0,
                    })
                }
                Some(kv) => {
                    if let Some(blocker) = classify(prefix, name, kv) {
                        return Ok(View {
                            standing: Standing::WaitFor {
                                key: blocker.key,
                                revision: blocker.create_revision,
                            },
                            revision: at,
                            earlier: 1,
                        });
                    }
                    // A key of a nested lock: look at the whole queue.
                }
            }
        }
        let response = self
            .read(by_create(prefix, SortOrder::Ascend), seen)
            .await?;
        let at = revision(response.header.as_ref());
        if !response
            .kvs
            .iter()
            .any(|kv| kv.key == key.as_bytes() && kv.create_revision == mine)
        {
            return Err(gone());
        }
        let all = contenders(prefix, name, &response.kvs);
        Ok(View {
            standing: standing(&all, mine, mode),
            revision: at,
            earlier: response
                .kvs
                .iter()
                .filter(|kv| kv.create_revision < mine)
                .count(),
        })
    }

    /// Turns the queue entry into a hold.
    #[allow(clippy::too_many_arguments)]
    fn grant(
        self: &Arc<Self>,
        name: &str,
        request: &AcquireRequest,
        key: String,
        token: i64,
        granted_at: i64,
        lease: QueueLease,
        meta: Meta,
        mut pending: Pending,
    ) -> Result<Option<Grant>> {
        pending.armed = false;
        let lost = LostSignal::new();
        let armed = Arc::new(AtomicBool::new(true));
        let hold_lease = match lease {
            QueueLease::Session(session) => {
                let registration = session.register(lost.clone());
                HoldLease::Session {
                    session,
                    registration,
                }
            }
            QueueLease::Own(own) => {
                own.keep(lost.clone(), self.client.clone());
                HoldLease::Own(own)
            }
        };
        let entry = Arc::new(Entry {
            name: name.to_owned(),
            owner: request.owner.clone(),
            key,
            token,
            lease: hold_lease,
            lost: lost.clone(),
            armed,
            watch: Mutex::new(None),
            granted_at,
            state: tokio::sync::Mutex::new(EntryState {
                meta,
                published: request.published.clone(),
            }),
        });
        tracing::debug!(backend = BACKEND, key = %entry.key, token, "granted");
        let weak: std::sync::Weak<dyn Deferrable> = Arc::downgrade(&entry) as _;
        self.hub.watch_later(weak);
        self.remember(entry.clone());
        Ok(Some(Grant {
            tokens: vec![token as u64],
            lost: lost.clone(),
            hold: Box::new(EtcdHold {
                inner: self.clone(),
                entry,
            }),
        }))
    }
}
