//! The session: one etcd lease per client, kept alive by the keeper (module
//! `keeper`) through keep-alives on one stream.
//!
//! Go's `concurrency.NewSession` does the same (`client.KeepAlive` on one
//! lease; every Mutex key of the session is attached to it). When the keeper
//! ends the lease (a keep-alive answers TTL 0 / "lease not found", or none
//! got through before it would run out), every hold attached to it is lost;
//! the next acquire grants a fresh lease.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::rpc::{EtcdClient, KeepAlive};
use super::{backend_error, BACKEND};
use crate::backend::LostSignal;
use crate::error::Result;
use crate::keeper::{self, Kept, Renew, Renewed, Term};
use crate::lost::LostCause;

/// One lease and what hangs on it.
pub(crate) struct Session {
    /// The lease id.
    pub id: i64,
    /// The TTL etcd granted (it raises requests below its minimum).
    pub ttl: Duration,
    /// Fires when the lease is gone or no longer trusted.
    dead: CancellationToken,
    /// Why it ended (the first reason wins).
    reason: Mutex<Option<(LostCause, String)>>,
    /// Lost signals of the holds on this lease.
    holds: Mutex<HashMap<u64, LostSignal>>,
    next_hold: AtomicU64,
    /// Keys in use on this lease (held, queued, or still being deleted), so that
    /// two owners of this client never share a key.
    keys: Mutex<HashSet<String>>,
    next_suffix: AtomicU64,
}

impl Session {
    /// Grants a lease of `ttl` (rounded up to whole seconds, as etcd counts) and
    /// starts its keep-alive task, which stops on `shutdown`.
    ///
    /// Cancel safety: a dropped grant may leave a lease without keys behind;
    /// it expires after its TTL.
    pub async fn start(
        client: EtcdClient,
        ttl: Duration,
        shutdown: CancellationToken,
    ) -> Result<Arc<Session>> {
        let seconds = ttl_seconds(ttl);
        let sent = Instant::now();
        let granted = client
            .grant_lease(seconds)
            .await
            .map_err(|e| backend_error("granting the session lease", e))?;
        let session = Arc::new(Session {
            id: granted.id,
            ttl: Duration::from_secs(granted.ttl.max(1) as u64),
            dead: CancellationToken::new(),
            reason: Mutex::new(None),
            holds: Mutex::new(HashMap::new()),
            next_hold: AtomicU64::new(0),
            keys: Mutex::new(HashSet::new()),
            next_suffix: AtomicU64::new(1),
        });
        tracing::debug!(
            backend = BACKEND,
            lease = format_args!("{:x}", session.id),
            ttl = ?session.ttl,
            "session lease granted"
        );
        let term = Term::renewed("the session lease", Kept::Session, sent, session.ttl);
        let renewal = KeepAlives {
            client,
            stream: None,
            id: session.id,
        };
        let kept = session.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = kept.dead.cancelled() => {}
                loss = keeper::keep(watch::Sender::new(term), renewal) => {
                    tracing::warn!(
                        backend = BACKEND,
                        lease = format_args!("{:x}", kept.id),
                        reason = %loss.reason,
                        "session lease lost"
                    );
                    kept.end(loss.cause, &loss.reason);
                }
            }
        });
        Ok(session)
    }

    /// Whether the lease is gone or untrusted.
    pub fn is_dead(&self) -> bool {
        self.dead.is_cancelled()
    }

    /// Completes when the session ends, with the reason.
    ///
    /// Cancel safety: safe; it only observes.
    pub async fn ended(&self) -> String {
        self.dead.cancelled().await;
        self.reason().unwrap_or_default()
    }

    /// Why it ended, once it has.
    pub fn reason(&self) -> Option<String> {
        let reason = self.reason.lock().expect("session reason");
        reason.as_ref().map(|(_, text)| text.clone())
    }

    /// Why it ended in a word, once it has.
    fn cause(&self) -> LostCause {
        let reason = self.reason.lock().expect("session reason");
        reason
            .as_ref()
            .map_or(LostCause::Other, |(cause, _)| *cause)
    }

    /// Ends the session: every hold on it is lost.
    pub fn end(&self, cause: LostCause, reason: &str) {
        self.reason
            .lock()
            .expect("session reason")
            .get_or_insert_with(|| (cause, reason.to_owned()));
        self.dead.cancel();
        let holds: Vec<LostSignal> = self
            .holds
            .lock()
            .expect("session holds")
            .drain()
            .map(|(_, s)| s)
            .collect();
        let reason = self.reason().unwrap_or_default();
        let cause = self.cause();
        for signal in holds {
            signal.fire_because(cause, reason.clone());
        }
    }

    /// Ties a hold's lost signal to this lease; fires at once if it already ended.
    pub fn register(&self, signal: LostSignal) -> u64 {
        let id = self.next_hold.fetch_add(1, Ordering::Relaxed);
        self.holds
            .lock()
            .expect("session holds")
            .insert(id, signal.clone());
        if let Some(reason) = self.is_dead().then(|| self.reason()).flatten() {
            signal.fire_because(self.cause(), reason);
        }
        id
    }

    /// Unties a released hold.
    pub fn unregister(&self, id: u64) {
        self.holds.lock().expect("session holds").remove(&id);
    }

    /// A key for a new contender: `base` (Go's `<prefix><lease hex>`) when this
    /// client has no other key there, else `base_<n>`, unique for this lease.
    pub fn allocate_key(&self, base: String) -> String {
        let mut keys = self.keys.lock().expect("session keys");
        let key = if keys.contains(&base) {
            let n = self.next_suffix.fetch_add(1, Ordering::Relaxed);
            format!("{base}_{n}")
        } else {
            base
        };
        keys.insert(key.clone());
        key
    }

    /// Gives a key back once it is deleted.
    pub fn free_key(&self, key: &str) {
        self.keys.lock().expect("session keys").remove(key);
    }
}

/// A TTL in whole seconds as etcd takes it: rounded up, at least 1 (etcd raises
/// it further to its minimum, 1.5 election timeouts rounded up: 2 s by default,
/// `minTTL` in etcdserver/server.go).
pub(crate) fn ttl_seconds(ttl: Duration) -> i64 {
    let whole = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    whole.max(1) as i64
}

/// The session lease's keep-alives, on one stream opened when first needed
/// and again after it broke.
struct KeepAlives {
    client: EtcdClient,
    stream: Option<KeepAlive>,
    id: i64,
}

#[async_trait]
impl Renew for KeepAlives {
    /// Cancel safety: safe; a dropped round trip leaves the stream in an
    /// unknown state, so it is dropped with it and opened again next time.
    async fn renew(&mut self, _: Duration) -> std::result::Result<Renewed, String> {
        let stream = self.stream.take();
        let answer = match stream {
            Some(mut open) => open.renew().await.map(|ttl| (open, ttl)),
            None => self.client.keep_alive(self.id).await,
        };
        match answer {
            Ok((open, ttl)) => {
                self.stream = Some(open);
                Ok(match ttl {
                    Some(ttl) => Renewed::For(Duration::from_secs(ttl.max(0) as u64)),
                    None => Renewed::Gone,
                })
            }
            Err(status) => {
                tracing::debug!(backend = BACKEND, %status, "keep-alive failed, retrying");
                Err(status.to_string())
            }
        }
    }
}
