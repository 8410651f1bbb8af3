//! The entry point: connect to a backend by URL, then make locks.
//!
//! The calls that make locks and elections (`Client::lock`, `rw_lock`,
//! `semaphore`, `multi_lock`, `election`) are written beside what they make,
//! in `lock.rs` and `election.rs`: those hold the client, and the client
//! needs nothing of theirs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::backend::{Backend, GrantRecord, LockInfo};
use crate::error::{Error, Result};
use crate::model::Model;
use crate::options::{redact, ConnectOptions};

/// A connection to one lock store. Cheap to clone (clones share it).
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    backend: Arc<dyn Backend>,
    /// The lock model's rules over the backend (re-entry table and all).
    model: Arc<Model>,
    owners: AtomicU64,
    instance: String,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("backend", &self.inner.backend.name())
            .finish()
    }
}

/// The store a URL's scheme names: the one table of schemes, for
/// [`Client::connect`] and the URL fuzz target alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Store {
    Memory,
    Server,
    Redis,
    ZooKeeper,
    Etcd,
    Postgres,
}

impl Store {
    pub(crate) fn of_scheme(scheme: &str) -> Option<Store> {
        Some(match scheme {
            "memory" => Store::Memory,
            "locksmith" | "locksmith+tls" => Store::Server,
            "redis" | "rediss" | "redis+redlock" | "redis+sentinel" | "rediss+sentinel"
            | "redis+cluster" | "rediss+cluster" => Store::Redis,
            "zk" | "zks" | "zookeeper" => Store::ZooKeeper,
            "etcd" | "etcds" => Store::Etcd,
            "postgres" | "postgresql" => Store::Postgres,
            _ => return None,
        })
    }
}

impl Client {
    /// Connects with default options. The URL scheme picks the backend:
    /// `memory://[table]`, `locksmith://host:port`, `locksmith+tls://…`, `redis://`, `rediss://`,
    /// `redis+redlock://h1,h2,h3`, `redis+sentinel://s1,s2/master`,
    /// `redis+cluster://h1,h2`, `zk://hosts/chroot`, `zks://hosts/chroot`, `etcd://hosts`, `etcds://hosts`,
    /// `postgres://…`.
    ///
    /// Cancel safety: safe; a dropped connect leaves nothing behind.
    pub async fn connect(url: &str) -> Result<Client> {
        Client::connect_with(url, ConnectOptions::default()).await
    }

    /// Connects with the given options.
    ///
    /// Cancel safety: safe; a dropped connect leaves nothing behind.
    pub async fn connect_with(url: &str, options: ConnectOptions) -> Result<Client> {
        if options.session_ttl < Duration::from_millis(100) {
            return Err(Error::InvalidArgument(format!(
                "session TTL of {:?} is below the minimum of 100ms",
                options.session_ttl
            )));
        }
        let scheme = url
            .split_once("://")
            .map(|(s, _)| s)
            .ok_or_else(|| Error::InvalidUrl {
                url: redact(url),
                reason: "expected scheme://…".into(),
            })?;
        /// Builds the backend of an enabled feature, or explains which feature to enable.
        macro_rules! backend {
            ($feature:literal, $module:ident :: $ty:ident) => {{
                #[cfg(feature = $feature)]
                let backend: Result<Arc<dyn Backend>> =
                    Ok(Arc::new(crate::$module::$ty::connect(url, &options).await?));
                #[cfg(not(feature = $feature))]
                let backend: Result<Arc<dyn Backend>> = Err(not_enabled(scheme, $feature));
                backend
            }};
        }
        let Some(store) = Store::of_scheme(scheme) else {
            return Err(Error::InvalidUrl {
                url: redact(url),
                reason: format!("unknown scheme {scheme:?}"),
            });
        };
        let backend = match store {
            Store::Memory => {
                #[cfg(feature = "memory")]
                let backend: Result<Arc<dyn Backend>> = Ok(Arc::new(
                    crate::memory::MemoryBackend::connect(url, &options)?,
                ));
                #[cfg(not(feature = "memory"))]
                let backend: Result<Arc<dyn Backend>> = Err(not_enabled(scheme, "memory"));
                backend
            }
            Store::Server => backend!("server", server::ServerBackend),
            Store::Redis => backend!("redis", redis::RedisBackend),
            Store::ZooKeeper => backend!("zookeeper", zookeeper::ZooKeeperBackend),
            Store::Etcd => backend!("etcd", etcd::EtcdBackend),
            Store::Postgres => backend!("postgres", postgres::PostgresBackend),
        };
        Ok(Client::from_backend(backend?))
    }

    /// Wraps a backend built by hand.
    pub fn from_backend(backend: Arc<dyn Backend>) -> Client {
        Client {
            inner: Arc::new(Inner {
                backend,
                model: Arc::default(),
                owners: AtomicU64::new(0),
                instance: uuid::Uuid::new_v4().simple().to_string()[..8].to_owned(),
            }),
        }
    }

    /// Holders and waiters of one lock.
    ///
    /// Cancel safety: safe, read-only.
    pub async fn describe(&self, name: &str) -> Result<Option<LockInfo>> {
        locksmith_core::validate_name(name).map_err(|source| Error::invalid_name(name, source))?;
        self.inner.backend.describe(name).await
    }

    /// Every lock whose name starts with `prefix` (`""` for all), sorted by name.
    ///
    /// Cancel safety: safe, read-only.
    pub async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        self.inner.backend.list(prefix).await
    }

    /// Recent grants of the locks under `prefix` (`""` for all), by name,
    /// oldest first within a lock: who held each lock, with which token, and
    /// how the hold ended. Only the locksmith server keeps a grant history;
    /// other stores answer [`crate::Error::Unsupported`].
    ///
    /// Cancel safety: safe, read-only.
    pub async fn history(&self, prefix: &str) -> Result<Vec<GrantRecord>> {
        self.inner.backend.history(prefix).await
    }

    /// Administrator: frees a lock whoever holds it. Holders see their guard lost.
    ///
    /// Cancel safety: the release may or may not have happened.
    pub async fn force_release(&self, name: &str) -> Result<()> {
        locksmith_core::validate_name(name).map_err(|source| Error::invalid_name(name, source))?;
        self.inner.backend.force_release(name).await
    }

    /// Releases everything this client holds and stops its background work.
    ///
    /// Cancel safety: if dropped midway, remaining holds end with the session.
    pub async fn close(&self) -> Result<()> {
        self.inner.backend.close().await
    }

    /// The lock model this client's acquires go through.
    pub(crate) fn model(&self) -> &Arc<Model> {
        &self.inner.model
    }

    /// The backend, for its name and capabilities.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.inner.backend
    }

    /// A new owner id, unique within this client.
    pub(crate) fn fresh_owner(&self) -> String {
        let n = self.inner.owners.fetch_add(1, Ordering::Relaxed);
        format!("{}-{n}", self.inner.instance)
    }
}

#[allow(dead_code)]
fn not_enabled(scheme: &str, feature: &'static str) -> Error {
    Error::BackendNotEnabled {
        scheme: scheme.into(),
        feature,
    }
}
