//! Live holds: release, the recorded re-entry depth, extension, lease timers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::layout::{key_value, Meta};
use super::rpc::etcdserverpb::{Compare, DeleteRangeRequest, PutRequest, TxnRequest};
use super::rpc::{self, EtcdClient};
use super::session::{ttl_seconds, Session};
use super::watch::{Deferrable, Sink, WatchGuard};
use super::{backend_error, Inner, BACKEND};
use crate::backend::Hold;
use crate::backend::LostSignal;
use crate::error::{Error, Loss, Result};
use crate::keeper::{self, Kept, Term};
use crate::lost::LostCause;

/// One hold of one lock by one owner.
pub(crate) struct Entry {
    pub name: String,
    pub owner: String,
    /// Our key.
    pub key: String,
    /// Its create revision: the fencing token.
    pub token: i64,
    pub lease: HoldLease,
    pub lost: LostSignal,
    /// Cleared before our own delete, so the key watch does not call it a loss.
    pub armed: Arc<AtomicBool>,
    /// The watch on our key, once [`super::watch::WatchHub::watch_later`]
    /// registered it.
    pub watch: Mutex<Option<WatchGuard>>,
    /// The revision at which we were found to hold (the watch starts after it).
    pub granted_at: i64,
    /// What the key's value holds; async so that value updates of one hold
    /// reach etcd in order.
    pub state: tokio::sync::Mutex<EntryState>,
}

impl Deferrable for Entry {
    fn watch_now(&self) -> Option<(Vec<u8>, i64, Sink)> {
        self.armed.load(Ordering::SeqCst).then(|| {
            let sink = Sink::Lost {
                signal: self.lost.clone(),
                armed: self.armed.clone(),
                token: self.token,
            };
            (self.key.clone().into_bytes(), self.granted_at + 1, sink)
        })
    }

    fn keep(&self, guard: WatchGuard) {
        // Released meanwhile: dropping the guard cancels the watch.
        if self.armed.load(Ordering::SeqCst) {
            *self.watch.lock().expect("hold watch") = Some(guard);
        }
    }
}

pub(crate) struct EntryState {
    /// What the key's value records (the re-entry depth among it).
    pub meta: Meta,
    /// An election's value, which the key holds instead of the metadata.
    pub published: Option<String>,
}

impl EntryState {
    /// What the key holds.
    pub fn value(&self) -> Vec<u8> {
        key_value(&self.meta, self.published.as_deref())
    }
}

/// What keeps the key alive.
pub(crate) enum HoldLease {
    /// The client's session lease; `registration` ties our lost signal to it.
    Session {
        session: Arc<Session>,
        registration: u64,
    },
    /// A lease of the hold's own (`Lock::lease`).
    Own(Arc<OwnLease>),
}

/// A hold's own lease: etcd's TTL (whole seconds, at least etcd's minimum) is
/// the fallback should this process die; while it lives, the keeper ends the
/// hold at exactly the requested lease: it fires `lost()` and revokes.
pub(crate) struct OwnLease {
    pub state: Mutex<OwnState>,
    /// The keeper's term of the hold: when it ends unless extended.
    pub term: watch::Sender<Term>,
    done: CancellationToken,
}

pub(crate) struct OwnState {
    pub id: i64,
    /// The TTL etcd granted, in seconds.
    pub ttl: i64,
}

impl OwnLease {
    /// A lease `id` of `ttl` seconds in etcd, granted by a request sent at
    /// `sent` for the hold's `lease`.
    pub fn new(id: i64, ttl: i64, sent: Instant, lease: Duration) -> Arc<OwnLease> {
        Arc::new(OwnLease {
            state: Mutex::new(OwnState { id, ttl }),
            term: watch::Sender::new(Term::fixed("the hold's lease", Kept::Hold, sent, lease)),
            done: CancellationToken::new(),
        })
    }

    pub fn id(&self) -> i64 {
        self.state.lock().expect("own lease").id
    }

    /// Has the keeper end the hold when its lease runs out: fires `lost`
    /// and revokes the lease.
    pub fn keep(self: &Arc<Self>, lost: LostSignal, client: EtcdClient) {
        let own = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = own.done.cancelled() => {}
                loss = keeper::keep_fixed(own.term.clone()) => {
                    lost.fire_because(loss.cause, loss.reason);
                    revoke_in_background(client, own.id());
                }
            }
        });
    }

    /// Stops the keeper (released).
    pub fn stop(&self) {
        self.done.cancel();
    }
}

/// Revokes a lease without waiting; a failure leaves it to expire.
pub(crate) fn revoke_in_background(client: EtcdClient, id: i64) {
    tokio::spawn(async move {
        if let Err(error) = client.revoke_lease(id).await {
            tracing::debug!(backend = BACKEND, lease = format_args!("{id:x}"), %error, "revoke failed; the lease will expire");
        }
    });
}

/// Renews a lease once: `Ok(false)` when it no longer exists.
///
/// Cancel safety: safe; the renewal happened or not.
pub(crate) async fn refresh(client: &EtcdClient, id: i64) -> Result<bool> {
    match client.keep_alive_once(id).await {
        Ok(ttl) => Ok(ttl.is_some()),
        Err(error) => Err(backend_error("renewing a lease", error)),
    }
}

/// The [`Hold`] a grant hands out: its key and what keeps it.
pub(crate) struct EtcdHold {
    pub inner: Arc<Inner>,
    pub entry: Arc<Entry>,
}

impl Entry {
    fn still_ours(&self) -> Compare {
        rpc::create_revision_is(self.key.clone(), self.token)
    }

    /// Writes the value for a new depth: `If(create_revision == token)
    /// Then(Put(ignore_lease))`; false when the key is no longer ours.
    ///
    /// Cancel safety: the write may or may not have happened (the count in
    /// the value is for inspection only).
    pub async fn write_count(&self, inner: &Inner, state: &EntryState, count: u32) -> Result<bool> {
        let mut meta = state.meta.clone();
        meta.count = count;
        let value = key_value(&meta, state.published.as_deref());
        self.write_if_ours(inner, value, "updating the hold count")
            .await
    }

    /// Replaces the key's value, keeping its lease: `If(create_revision ==
    /// token) Then(Put(ignore_lease))`; false when the key is no longer ours.
    ///
    /// Cancel safety: the write either happened or did not.
    pub async fn write_if_ours(
        &self,
        inner: &Inner,
        value: Vec<u8>,
        doing: &'static str,
    ) -> Result<bool> {
        let put = PutRequest {
            ignore_lease: true,
            ..rpc::put(self.key.clone(), value, 0)
        };
        let txn = TxnRequest {
            compare: vec![self.still_ours()],
            success: vec![put.into()],
            failure: Vec::new(),
        };
        let response = inner
            .client
            .txn(txn)
            .await
            .map_err(|e| backend_error(doing, e))?;
        Ok(response.succeeded)
    }

    pub(crate) fn lose(&self, why: &str) -> Error {
        self.lost.fire_because(LostCause::Gone, why);
        Error::Lost(Loss::of(&self.lost).unwrap_or_else(|| Loss::because(LostCause::Gone, why)))
    }
}

#[async_trait]
impl Hold for EtcdHold {
    /// Cancel safety: the delete of the key runs in its own task, so it
    /// completes even if this future is dropped.
    async fn release(self: Box<Self>) -> Result<()> {
        let entry = self.entry.clone();
        let span = tracing::debug_span!("release", backend = BACKEND, key = %entry.key, token = entry.token);
        async move {
            self.inner.forget(&entry);
            entry.armed.store(false, Ordering::SeqCst);
            entry.watch.lock().expect("hold watch").take();
            let lost_before = Loss::of(&entry.lost);
            // Should this future be dropped mid-delete, the guard finishes it.
            let mut unfinished = Unfinished {
                inner: self.inner.clone(),
                entry: entry.clone(),
                armed: true,
            };
            let deleted = delete_key(&self.inner, &entry).await;
            unfinished.armed = false;
            let deleted = deleted?;
            match (deleted, lost_before) {
                (_, Some(loss)) => Err(Error::Lost(loss)),
                (false, None) => Err(entry.lose(
                    "the key was gone before release (lease expired or revoked, or deleted)",
                )),
                (true, None) => Ok(()),
            }
        }
        .instrument(span)
        .await
    }

    /// Writes the depth into the key's value (`count=`), checked: a key that
    /// is no longer ours loses the hold.
    ///
    /// Cancel safety: the write may or may not have happened (the count is
    /// for inspection only).
    async fn record_count(&self, count: u32) -> Result<()> {
        let entry = &self.entry;
        let mut state = entry.state.lock().await;
        if !entry.write_count(&self.inner, &state, count).await? {
            return Err(entry.lose("the key is no longer ours"));
        }
        state.meta.count = count;
        Ok(())
    }

    /// Cancel safety: safe; either the lease was renewed / replaced and the
    /// key moved to it, or nothing changed (a replacement lease granted by a
    /// dropped call expires without keys).
    async fn extend(&self, lease: Duration) -> Result<()> {
        let entry = &self.entry;
        let HoldLease::Own(own) = &entry.lease else {
            return Err(Error::InvalidArgument(
                "this hold has no lease of its own: it lives with the client's session".into(),
            ));
        };
        let span = tracing::debug_span!("extend", backend = BACKEND, key = %entry.key, ?lease);
        async move {
            let client = &self.inner.client;
            let wanted = ttl_seconds(lease);
            let (id, ttl) = {
                let state = own.state.lock().expect("own lease");
                (state.id, state.ttl)
            };
            let sent = Instant::now();
            if wanted <= ttl {
                // A keep-alive restores the lease's TTL, which covers the request.
                if !refresh(client, id).await? {
                    return Err(entry.lose("the hold's lease is gone"));
                }
            } else {
                // etcd cannot change a lease's TTL: move the key to a new lease.
                let granted = client
                    .grant_lease(wanted)
                    .await
                    .map_err(|e| backend_error("granting a longer lease", e))?;
                let state = entry.state.lock().await;
                let put = rpc::put(entry.key.clone(), state.value(), granted.id);
                drop(state);
                let txn = TxnRequest {
                    compare: vec![entry.still_ours()],
                    success: vec![put.into()],
                    failure: Vec::new(),
                };
                let moved = client
                    .txn(txn)
                    .await
                    .map_err(|e| backend_error("moving the key to a longer lease", e));
                let moved = match moved {
                    Ok(response) => response.succeeded,
                    Err(error) => {
                        revoke_in_background(client.clone(), granted.id);
                        return Err(error);
                    }
                };
                if !moved {
                    revoke_in_background(client.clone(), granted.id);
                    return Err(entry.lose("the key is no longer ours"));
                }
                {
                    let mut state = own.state.lock().expect("own lease");
                    state.id = granted.id;
                    state.ttl = granted.ttl;
                }
                revoke_in_background(client.clone(), id);
            }
            if let Some(loss) = Loss::of(&entry.lost) {
                return Err(Error::Lost(loss));
            }
            own.term.send_modify(|term| term.extended(sent, lease));
            Ok(())
        }
        .instrument(span)
        .await
    }

    /// Go's `Election.Proclaim`: `If(CreateRevision(key) == ours).Then(Put(key,
    /// value))`, the key keeping its lease; fails with `lost` when the key is no
    /// longer ours.
    ///
    /// Cancel safety: safe; the new value either landed or did not.
    async fn proclaim(&self, value: &str) -> Result<()> {
        let entry = &self.entry;
        // Held across the write: value updates of one hold reach etcd in order.
        let mut state = entry.state.lock().await;
        let value_bytes = value.as_bytes().to_vec();
        let written = entry
            .write_if_ours(&self.inner, value_bytes, "proclaiming a new value")
            .await?;
        if !written {
            return Err(entry.lose("the election key is no longer ours"));
        }
        state.published = Some(value.to_owned());
        Ok(())
    }
}

/// Deletes a key on the session lease until etcd confirms it, retrying with
/// backoff while the session lives (when it ends, etcd deletes the key).
///
/// Cancel safety: if dropped midway the key may stay until the session ends.
pub(crate) async fn delete_until_done(inner: &Inner, key: &str, session: &Session) {
    let mut pause = Duration::from_millis(100);
    loop {
        match inner.client.delete(rpc::delete(key)).await {
            Ok(_) => {
                session.free_key(key);
                return;
            }
            Err(error) => {
                tracing::debug!(backend = BACKEND, %key, %error, "deleting a lock key failed; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = session.ended() => return,
                }
                pause = (pause * 2).min(Duration::from_secs(2));
            }
        }
    }
}

/// A final delete that has not completed; dropped armed, it completes the
/// delete in a task.
struct Unfinished {
    inner: Arc<Inner>,
    entry: Arc<Entry>,
    armed: bool,
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (inner, entry) = (self.inner.clone(), self.entry.clone());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = delete_key(&inner, &entry).await;
            });
        }
    }
}

/// Deletes our key, as Go's `Mutex.Unlock` does (a plain `Delete(myKey)`,
/// which etcd applies measurably cheaper than a compare-and-delete
/// transaction), and gives back what it used. True when the deleted key was
/// ours (its create revision is our token). Only this hold ever writes its
/// key: the name carries our lease id and this client reserves it until the
/// hold is released, so a plain delete cannot remove anyone else's key.
///
/// Cancel safety: the delete may or may not have happened; callers finish
/// it in a task when dropped (see `Unfinished`).
async fn delete_key(inner: &Arc<Inner>, entry: &Entry) -> Result<bool> {
    let request = DeleteRangeRequest {
        prev_kv: true,
        ..rpc::delete(entry.key.clone())
    };
    let result = inner
        .client
        .delete(request)
        .await
        .map_err(|e| backend_error("deleting the lock key", e));
    match &entry.lease {
        HoldLease::Session {
            session,
            registration,
        } => {
            session.unregister(*registration);
            if result.is_ok() {
                session.free_key(&entry.key);
            } else {
                // The key would otherwise hold the lock as long as the
                // session lives: keep trying in the background.
                let (inner, session, key) = (inner.clone(), session.clone(), entry.key.clone());
                tokio::spawn(async move { delete_until_done(&inner, &key, &session).await });
            }
        }
        HoldLease::Own(own) => {
            own.stop();
            revoke_in_background(inner.client.clone(), own.id());
        }
    }
    Ok(result?
        .prev_kvs
        .first()
        .is_some_and(|kv| kv.create_revision == entry.token))
}
