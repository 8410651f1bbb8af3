//! The entry point: connect to a backend by URL, then make locks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use locksmith_core::Mode;

use crate::backend::{Backend, GrantRecord, LockInfo};
use crate::election::Election;
use crate::error::{Error, Result};
use crate::lock::{Lock, RwLock};
use crate::model::Model;

/// How a client presents itself and keeps its holds alive.
///
/// Start from the defaults and change what you need; new options can be
/// added without breaking callers:
///
/// ```
/// # use std::time::Duration;
/// let options = locksmith::ConnectOptions::default()
///     .session_ttl(Duration::from_secs(10))
///     .client_name("nightly-report");
/// assert_eq!(options.session_ttl, Duration::from_secs(10));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnectOptions {
    /// Liveness of holds without a fixed lease: the session TTL (or the lease the
    /// watchdog renews at a third of it). Default 30 s, Redisson's watchdog.
    pub session_ttl: Duration,
    /// Shown as `lock_by` in inspection. Default: the program name and pid.
    pub client_name: String,
    /// Host shown in inspection. Default: this machine's hostname.
    pub host: String,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        let program = std::env::args()
            .next()
            .and_then(|p| {
                std::path::Path::new(&p)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
            })
            .unwrap_or_else(|| "locksmith".into());
        ConnectOptions {
            session_ttl: Duration::from_secs(30),
            client_name: format!("{program}[{}]", std::process::id()),
            host: hostname(),
        }
    }
}

impl ConnectOptions {
    /// Sets [`ConnectOptions::session_ttl`].
    pub fn session_ttl(mut self, ttl: Duration) -> Self {
        self.session_ttl = ttl;
        self
    }

    /// Sets [`ConnectOptions::client_name`].
    pub fn client_name(mut self, name: impl Into<String>) -> Self {
        self.client_name = name.into();
        self
    }

    /// Sets [`ConnectOptions::host`].
    pub fn host(mut self, host: impl Into<String>) -> Self {
        self.host = host.into();
        self
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

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

    /// An exclusive lock.
    pub fn lock(&self, name: impl Into<String>) -> Lock {
        Lock::new(self.clone(), vec![name.into()], Mode::Exclusive)
    }

    /// A read-write lock.
    pub fn rw_lock(&self, name: impl Into<String>) -> RwLock {
        RwLock::new(self.clone(), name.into())
    }

    /// A semaphore of `permits` holders. Every user of the name must agree on
    /// `permits`; a mismatch is [`Error::Conflict`].
    pub fn semaphore(&self, name: impl Into<String>, permits: u32) -> Lock {
        Lock::new(self.clone(), vec![name.into()], Mode::Semaphore { permits })
    }

    /// Several exclusive locks taken all or nothing, without deadlock against
    /// other multi-locks in any order.
    pub fn multi_lock<I, S>(&self, names: I) -> Lock
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Lock::new(
            self.clone(),
            names.into_iter().map(Into::into).collect(),
            Mode::Exclusive,
        )
    }

    /// Leader election on a lock name.
    pub fn election(&self, name: impl Into<String>) -> Election {
        Election::new(self.clone(), name.into())
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

/// The URL with every password replaced by `***`, for messages and reports:
/// each member of a multi-host URL is redacted too.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    // Each member of a multi-host URL (`redis+sentinel://`, `redis+redlock://`,
    // `locksmith://a,b,c`) may carry its own user and password.
    let members: Vec<String> = authority
        .split(',')
        .map(|member| match member.rsplit_once('@') {
            Some((userinfo, host)) => match userinfo.split_once(':') {
                Some((user, _)) => format!("{user}:***@{host}"),
                None => member.to_owned(),
            },
            None => member.to_owned(),
        })
        .collect();
    format!("{scheme}://{}{tail}", members.join(","))
}

/// `%XX` escapes of a URL part decoded; `None` for a bad escape or text that
/// is not UTF-8.
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
pub(crate) fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod redact_tests {
    use super::redact;

    #[test]
    fn every_password_is_redacted_in_single_and_multi_host_urls() {
        assert_eq!(
            redact("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(
            redact("redis+sentinel://:pw@s1:26379,s2:26379/mymaster"),
            "redis+sentinel://:***@s1:26379,s2:26379/mymaster"
        );
        assert_eq!(
            redact("redis+redlock://a:one@h1:1,b:two@h2:2,h3:3?x=y"),
            "redis+redlock://a:***@h1:1,b:***@h2:2,h3:3?x=y"
        );
        assert_eq!(redact("no url"), "no url");
    }
}
