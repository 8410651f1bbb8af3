//! `etcd://`: locks in etcd v3, in the layout of etcd's own `concurrency` package,
//! so `etcdctl lock`, Go's `concurrency.Mutex` and locksmith exclude each other.
//!
//! # URL
//!
//! ```text
//! etcd://[user:password@]host[:port][,host[:port]…][/][?prefix=<namespace>]
//! etcds://[user:password@]host[:port][,…][/]?ca=<PEM file>[&cert=<PEM file>&key=<PEM file>][&prefix=…]
//! ```
//!
//! - Hosts: one or more etcd members, comma-separated; the port defaults to
//!   2379. Requests are balanced over them.
//! - `user:password`: etcd authentication (percent-encode special
//!   characters): the client logs in with `Authenticate` and sends the token
//!   on every call. The password never appears in errors, logs or `Debug`
//!   output.
//! - `etcds://`: TLS (rustls) to every member. `ca` names the CA certificate
//!   the members' certificates must chain to (and their host names or IP
//!   addresses must match the URL's hosts); `cert` and `key` (together) are
//!   the client certificate for members started with `--client-cert-auth`.
//! - `prefix`: a namespace, **opt-in**. Without it, lock `orders/42` lives at
//!   `orders/42/…`, exactly where `etcdctl lock orders/42` looks. With
//!   `?prefix=locks` (or `locks/`) it lives at `locks/orders/42/…`, where
//!   `etcdctl lock locks/orders/42` and Go's `namespace.NewKV(cli, "locks/")`
//!   look. Nothing is prefixed unless you ask.
//!
//! Any other query parameter is an error. etcd 3.4 or newer is required
//! (client-chosen watch ids).
//!
//! The backend speaks etcd's gRPC API through [`rpc`], a small client over
//! code generated at build time by the protoc vendored in `locksmith-proto`,
//! so building it needs no protoc on the machine.
//!
//! # Layout (the contract with other clients)
//!
//! A lock `name` is the key prefix `<namespace><name>/`; every key under it is
//! a contender, and its **create revision** is both its place in the queue and
//! its fencing token. This is Go's `concurrency.NewMutex(session, name)`
//! (`client/v3/concurrency/mutex.go`: `pfx = name + "/"`,
//! `myKey = fmt.Sprintf("%s%x", pfx, session.Lease())`), which is what
//! `etcdctl lock <name>` runs (`etcdctl/ctlv3/command/lock_command.go`).
//!
//! | mode | key | value |
//! |---|---|---|
//! | exclusive (`lock`, `rw_lock().write()`) | `<name>/<lease id in hex>` | metadata |
//! | election candidate | `<name>/<lease id in hex>` | the candidate's value |
//! | shared (`rw_lock().read()`) | `<name>/read/<lease id in hex>` | metadata |
//! | semaphore of N | `<name>/<lease id in hex>` | metadata, incl. N |
//!
//! - **Exclusive**: held when ours is the oldest contender; otherwise wait for
//!   the delete of the contender created just before ours, re-read, repeat
//!   (Go's `waitDeletes`), and re-check that our own key still exists after
//!   each wake-up (etcd #11408, the Jepsen finding). So the queue is FIFO and a
//!   release wakes exactly one waiter.
//! - **Shared**: the reader prefix of etcd's recipe RWMutex
//!   (`contrib/recipes/rwmutex.go`, `pfx + "/read"`). A reader holds when every
//!   older contender is a reader; it waits for the newest older non-reader.
//!   A writer is an exclusive contender, so it waits for everything older,
//!   readers included, and readers arriving after a waiting writer queue behind
//!   it (no writer starvation). Keys of the recipe's writers
//!   (`<name>/write/<x>`) count as exclusive contenders.
//! - **Semaphore of N**: the N oldest contenders hold, if all contenders older
//!   than ours are semaphore keys. etcd has no semaphore recipe; this is the
//!   Mutex layout with the permit count in each value. Every contender records
//!   its N, and an acquire naming a different N fails with
//!   [`Error::Conflict`] (kazoo's rule). A waiter
//!   watches the whole prefix for deletes, so one release wakes every waiter of
//!   that semaphore (a small herd, bounded by its queue).
//!
//! Go's Mutex counts *every* key under the prefix as a contender, so to
//! `etcdctl lock` our readers and semaphore holders look like exclusive
//! holders: it waits for them, which is safe. Conversely we treat a foreign
//! key directly under the prefix as an exclusive contender, `read/<x>` as a
//! recipe reader and `write/<x>` as a recipe writer, and ignore deeper foreign
//! keys (nested lock names). Our own keys carry the lock name in their value, so
//! `a` and `a/b` (or `a/read`) never mix up locksmith's own contenders.
//! Caveat of the shared layout: a foreign key `a/read/<x>` is a reader of `a`
//! and at the same time an `etcdctl lock a/read` holder.
//!
//! The **value** of each locksmith key is text metadata for inspection (other
//! clients ignore values; Go's Mutex writes `""`):
//!
//! ```text
//! locksmith/1
//! name=orders/42
//! owner=9f3a2c1d-0
//! mode=exclusive            (or shared, semaphore/4)
//! by=billing[4242]@host-1
//! since=1718000000000       (ms since the epoch, when it queued)
//! count=1                   (re-entry depth)
//! ```
//!
//! # Elections
//!
//! An [`Election`](crate::Election) is Go's `concurrency.Election`
//! (`client/v3/concurrency/election.go`, what `etcdctl elect NAME VALUE` and
//! `etcdctl elect -l NAME` run): its prefix is `<name>/`, a candidate is an
//! exclusive contender whose key holds its value and nothing else (Go reads
//! the leader's value raw), and the leader is the contender with the lowest
//! create revision. `proclaim` is Go's `Proclaim`:
//! `If(CreateRevision(key) == token).Then(Put(key, value))`, keeping the
//! lease. `observe` watches the prefix, as Go's `Observe` does. Inspection
//! shows a candidate's value as its owner, whoever campaigned.
//!
//! # Sessions, leases, liveness
//!
//! Each client grants one etcd lease, its **session** (TTL = the client's
//! [`ConnectOptions::session_ttl`], rounded up to whole seconds; etcd raises
//! anything below its minimum, 1.5 election timeouts rounded up, 2 s by
//! default) and renews it every TTL/3. Holds without [`Lock::lease`] hang on
//! it. [`Guard::lost`] fires when the session lease is gone (a keep-alive
//! answers TTL 0), when it could not be renewed before it would run out, or at
//! once when the key itself is deleted (every hold watches its key on one
//! shared watch stream; revoking the lease deletes the keys). After a lost
//! session, the next acquire grants a new lease.
//!
//! Several owners of one client on one lock (tasks sharing a `Client`) need
//! keys of their own, but the Go layout has one key per session. The first
//! contender of a client on a lock takes `<name>/<lease hex>`, the exact Go
//! key; further ones take `<name>/<lease hex>_<n>`. Go orders by create
//! revision and never parses the key, so interop is unaffected. Re-entry (the
//! same owner again, decided by the model layer) keeps the key and the
//! token; the value's `count` records its depth.
//!
//! **Leased holds** ([`Lock::lease`]) get an etcd lease of their own (TTL
//! rounded up to whole seconds, at least etcd's minimum), never kept alive
//! once granted. etcd's TTL is the fallback should the process die; while it
//! lives, a local timer ends the hold at exactly the requested time: it fires
//! `lost()` and revokes the lease. While such an acquire *waits*, its lease is
//! kept alive, and the hold's time starts at the grant. [`Guard::extend`]:
//! etcd cannot change a lease's TTL, so an extension that fits in the granted
//! TTL is a single keep-alive (which restores the full TTL); a longer one
//! grants a new lease and moves the key onto it in a transaction guarded by
//! the fencing token (the key and its create revision stay).
//!
//! Lock-delay is not supported on etcd (an acquire asking for it fails with
//! [`Error::Unsupported`]). Multi-locks take their
//! names one at a time in sorted order.
//!
//! # Fencing with etcd itself
//!
//! The token is the create revision of our key, so a write to etcd can be made
//! conditional on still holding the lock: `If(create_revision(key) == token)`,
//! the comparison Go's `Mutex.IsOwner()` builds. Keep the concrete backend to
//! ask for it:
//!
//! ```no_run
//! # async fn demo() -> locksmith::Result<()> {
//! use std::sync::Arc;
//! use locksmith::etcd::{rpc::{self, etcdserverpb::TxnRequest}, EtcdBackend};
//! use locksmith::{Client, ConnectOptions};
//!
//! let backend = Arc::new(
//!     EtcdBackend::connect("etcd://127.0.0.1:2379", &ConnectOptions::default()).await?,
//! );
//! let client = Client::from_backend(backend.clone());
//! let guard = client.lock("orders/42").acquire().await?;
//! let txn = TxnRequest {
//!     compare: vec![backend.fenced_compare(&guard)?],
//!     success: vec![rpc::put("orders/42/state", "paid", 0).into()],
//!     failure: vec![],
//! };
//! let applied = backend.etcd_client().txn(txn).await.expect("txn").succeeded;
//! assert!(applied, "only the holder's write lands");
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! [`fence`] builds the same comparison from a key and token obtained any
//! other way (for instance `ETCD_LOCK_KEY` of `etcdctl lock name -- cmd`).
//!
//! # Inspection
//!
//! [`describe`](crate::Client::describe) lists the contenders of a lock in
//! queue order, holders first (owner, `lock_by`, queue time, token, lease
//! expiry from `LeaseTimeToLive`, mode, depth). Foreign contenders show the
//! value they stored (a Go election's proposal) or their lease id as owner.
//! [`list`](crate::Client::list) finds locksmith keys by their value and
//! foreign ones by the Go shape (last segment = hex id of the key's lease).
//!
//! [`ConnectOptions::session_ttl`]: crate::ConnectOptions::session_ttl
//! [`Lock::lease`]: crate::Lock::lease
//! [`Guard::lost`]: crate::Guard::lost
//! [`Guard::extend`]: crate::Guard::extend

mod acquire;
mod cleanups;
mod election;
mod hold;
mod layout;
pub mod rpc;
mod session;
mod watch;

pub(crate) use self::cleanups::forget as forget_cleanups;

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use self::hold::Entry;
use self::layout::{contenders, listed_lock_name, lock_prefix, standing, Contender, Standing};
use self::rpc::etcdserverpb::range_request::SortOrder;
use self::rpc::etcdserverpb::{Compare, TxnRequest};
use self::rpc::mvccpb::KeyValue;
use self::rpc::EtcdClient;
use self::session::Session;
use self::watch::WatchHub;
use crate::backend::{
    AcquireRequest, Backend, Capabilities, Grant, Holder, HolderChanges, LockInfo, Waiter,
};
use crate::error::{Error, Result};
use crate::guard::Guard;
use crate::lost::LostCause;
use crate::options::{percent_decode, redact, ConnectOptions};
use crate::secret::Secret;
use crate::tls::TlsFiles;

const BACKEND: &str = "etcd";

/// etcd's default client port.
const DEFAULT_PORT: u16 = 2379;

/// A backend on etcd; see the [module docs](self) for the layout.
pub struct EtcdBackend {
    inner: Arc<Inner>,
}

/// State shared by the backend, its holds and its tasks.
pub(crate) struct Inner {
    client: EtcdClient,
    /// `""` or `"<prefix>/"`.
    namespace: String,
    /// `client_name@host`, written into every value.
    lock_by: String,
    session_ttl: Duration,
    session: Mutex<Arc<Session>>,
    /// Serializes granting a replacement session.
    renewing: tokio::sync::Mutex<()>,
    hub: WatchHub,
    /// Live holds by name, then owner, for [`EtcdBackend::holder_key`] and
    /// closing.
    holds: Mutex<HashMap<String, HashMap<String, Arc<Entry>>>>,
    shutdown: CancellationToken,
    closed: AtomicBool,
}

/// An etcd failure with what we were doing.
#[derive(Debug, thiserror::Error)]
#[error("{context}: {source}")]
struct Failure {
    context: &'static str,
    #[source]
    source: tonic::Status,
}

pub(crate) fn backend_error(context: &'static str, source: tonic::Status) -> Error {
    Error::backend(BACKEND, Failure { context, source })
}

/// Where to connect, parsed from the URL.
#[derive(Debug, PartialEq, Eq)]
struct Target {
    endpoints: Vec<String>,
    user: Option<(String, Secret)>,
    /// `etcds://`: the TLS files.
    tls: Option<TlsFiles>,
    namespace: String,
}

/// tonic's TLS settings from the files of `etcds://`.
fn tls_config(files: &TlsFiles) -> std::result::Result<tonic::transport::ClientTlsConfig, String> {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let pem = files.read()?;
    let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem.ca));
    if let Some((cert, key)) = pem.identity {
        config = config.identity(Identity::from_pem(cert, key));
    }
    Ok(config)
}

fn parse_url(url: &str) -> Result<Target> {
    let invalid = |reason: String| Error::InvalidUrl {
        url: redact(url),
        reason,
    };
    let (secure, rest) = match (url.strip_prefix("etcd://"), url.strip_prefix("etcds://")) {
        (Some(rest), _) => (false, rest),
        (_, Some(rest)) => (true, rest),
        _ => {
            return Err(invalid(
                "expected etcd://host:port[,host:port…] or etcds://…?ca=<PEM file>".into(),
            ))
        }
    };
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (rest, fragment) = rest.split_once('#').unwrap_or((rest, ""));
    if !fragment.is_empty() {
        return Err(invalid("a fragment (#…) means nothing here".into()));
    }
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    if !path.is_empty() {
        return Err(invalid(format!(
            "unexpected path /{path}: use ?prefix={path} for a namespace"
        )));
    }
    let (user, hosts) = match authority.rsplit_once('@') {
        Some((info, hosts)) => {
            let (name, password) = info.split_once(':').unwrap_or((info, ""));
            let name =
                percent_decode(name).ok_or_else(|| invalid("bad %-escape in the user".into()))?;
            let password = percent_decode(password)
                .ok_or_else(|| invalid("bad %-escape in the password".into()))?;
            if name.is_empty() {
                return Err(invalid("empty user name".into()));
            }
            (Some((name, Secret::new(password))), hosts)
        }
        None => (None, authority),
    };
    let mut endpoints = Vec::new();
    for host in hosts.split(',') {
        endpoints.push(endpoint(host, secure).map_err(invalid)?);
    }
    let mut namespace = String::new();
    let (mut ca, mut cert, mut key) = (None, None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (field, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value =
            percent_decode(value).ok_or_else(|| invalid(format!("bad %-escape in {field}")))?;
        match field {
            "prefix" => {
                let trimmed = value.trim_end_matches('/');
                if trimmed.is_empty() {
                    return Err(invalid(
                        "prefix= needs a namespace, like prefix=locks".into(),
                    ));
                }
                namespace = format!("{trimmed}/");
            }
            "ca" | "cert" | "key" if !secure => {
                return Err(invalid(format!(
                    "{field}= is a TLS option: use etcds:// for TLS"
                )))
            }
            "ca" | "cert" | "key" if value.is_empty() => {
                return Err(invalid(format!("{field}= needs a PEM file")))
            }
            "ca" => ca = Some(PathBuf::from(value)),
            "cert" => cert = Some(PathBuf::from(value)),
            "key" => key = Some(PathBuf::from(value)),
            other => {
                return Err(invalid(format!(
                    "unknown option {other:?} (known: prefix, and with etcds:// ca, cert, key)"
                )))
            }
        }
    }
    let tls = match secure {
        true => Some(TlsFiles::from_options("etcds://", ca, cert, key).map_err(invalid)?),
        false => None,
    };
    Ok(Target {
        endpoints,
        user,
        tls,
        namespace,
    })
}

/// `host[:port]` or `[v6][:port]` as `http://host:port` (`https://` when
/// `secure`).
fn endpoint(host: &str, secure: bool) -> std::result::Result<String, String> {
    if host.is_empty() {
        return Err("empty host (expected host:port[,host:port…])".into());
    }
    let (name, port) = if let Some(v6) = host.strip_prefix('[') {
        let (address, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("unclosed [ in {host:?}"))?;
        match after {
            "" => (format!("[{address}]"), None),
            _ => (
                format!("[{address}]"),
                Some(
                    after
                        .strip_prefix(':')
                        .ok_or_else(|| format!("bad port in {host:?}"))?,
                ),
            ),
        }
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) => (name.to_owned(), Some(port)),
            None => (host.to_owned(), None),
        }
    };
    if name.is_empty() || name.contains(['/', '@', ' ']) {
        return Err(format!("bad host {host:?}"));
    }
    let port = match port {
        Some(port) => port
            .parse::<u16>()
            .map_err(|_| format!("bad port in {host:?}"))?,
        None => DEFAULT_PORT,
    };
    let scheme = if secure { "https" } else { "http" };
    Ok(format!("{scheme}://{name}:{port}"))
}

impl EtcdBackend {
    /// Connects to the etcd members named by `url` (see the [module docs](self))
    /// and grants the session lease.
    ///
    /// Cancel safety: safe; a dropped connect leaves at most a lease without
    /// keys, which expires after its TTL.
    pub async fn connect(url: &str, options: &ConnectOptions) -> Result<Self> {
        let target = parse_url(url)?;
        let tls = match &target.tls {
            Some(files) => Some(tls_config(files).map_err(|reason| Error::InvalidUrl {
                url: redact(url),
                reason,
            })?),
            None => None,
        };
        let user = target
            .user
            .as_ref()
            .map(|(name, password)| (name.clone(), password.expose().to_owned()));
        let span =
            tracing::debug_span!("connect", backend = BACKEND, endpoints = ?target.endpoints);
        async move {
            let client = EtcdClient::connect(&target.endpoints, user, tls)
                .await
                .map_err(|e| backend_error("connecting", e))?;
            let shutdown = CancellationToken::new();
            let session =
                Session::start(client.clone(), options.session_ttl, shutdown.clone()).await?;
            let hub = WatchHub::start(client.clone(), shutdown.clone());
            Ok(EtcdBackend {
                inner: Arc::new(Inner {
                    client,
                    namespace: target.namespace,
                    lock_by: format!("{}@{}", options.client_name, options.host),
                    session_ttl: options.session_ttl,
                    session: Mutex::new(session),
                    renewing: tokio::sync::Mutex::new(()),
                    hub,
                    holds: Mutex::new(HashMap::new()),
                    shutdown,
                    closed: AtomicBool::new(false),
                }),
            })
        }
        .instrument(span)
        .await
    }

    /// The underlying etcd client (a cheap clone), for guarded transactions
    /// and anything else on the same connections.
    pub fn etcd_client(&self) -> EtcdClient {
        self.inner.client.clone()
    }

    /// The namespace from `?prefix=` (with its trailing `/`), or `""`.
    pub fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    /// The id of the current session lease (holds without a lease of their own
    /// are attached to it).
    pub fn session_lease(&self) -> i64 {
        self.inner.session.lock().expect("session").id
    }

    /// The etcd key of a hold of this client, found by lock name and fencing
    /// token; `None` if this client does not hold it (any more).
    pub fn holder_key(&self, name: &str, token: u64) -> Option<String> {
        self.inner
            .holds
            .lock()
            .expect("holds")
            .get(name)?
            .values()
            .find(|entry| entry.token as u64 == token)
            .map(|entry| entry.key.clone())
    }

    /// `If(create_revision(key) == token)` for the guard's (first) lock: a
    /// transaction guarded by it applies only while the hold is still the
    /// current one (Go's `Mutex.IsOwner()`). Fails with
    /// [`Error::NotHeld`] for a guard of another
    /// client or backend, or one already released.
    pub fn fenced_compare(&self, guard: &Guard) -> Result<Compare> {
        let key = self
            .holder_key(guard.name(), guard.fencing_token())
            .ok_or_else(|| Error::NotHeld {
                name: guard.name().to_owned(),
            })?;
        Ok(fence(key, guard.fencing_token()))
    }

    /// [`EtcdBackend::fenced_compare`] for every lock of a multi-lock guard, in
    /// the order they were named.
    pub fn fenced_compares(&self, guard: &Guard) -> Result<Vec<Compare>> {
        guard
            .names()
            .iter()
            .zip(guard.fencing_tokens())
            .map(|(name, &token)| {
                self.holder_key(name, token)
                    .map(|key| fence(key, token))
                    .ok_or_else(|| Error::NotHeld { name: name.clone() })
            })
            .collect()
    }
}

/// `If(create_revision(key) == token)`: the fencing comparison for a lock key
/// and its token, however they were obtained.
pub fn fence(key: impl Into<Vec<u8>>, token: u64) -> Compare {
    rpc::create_revision_is(key, token as i64)
}

impl Inner {
    /// The live session, granting a new one if the last ended.
    ///
    /// Cancel safety: safe; a dropped grant leaves a lease without keys.
    async fn session(&self) -> Result<Arc<Session>> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(Error::Closed);
        }
        let current = self.session.lock().expect("session").clone();
        if !current.is_dead() {
            return Ok(current);
        }
        let _one = self.renewing.lock().await;
        let current = self.session.lock().expect("session").clone();
        if !current.is_dead() {
            return Ok(current);
        }
        tracing::info!(backend = BACKEND, reason = ?current.reason(), "session ended; granting a new lease");
        let fresh =
            Session::start(self.client.clone(), self.session_ttl, self.shutdown.clone()).await?;
        *self.session.lock().expect("session") = fresh.clone();
        Ok(fresh)
    }

    fn remember(&self, entry: Arc<Entry>) {
        let mut holds = self.holds.lock().expect("holds");
        holds
            .entry(entry.name.clone())
            .or_default()
            .insert(entry.owner.clone(), entry);
    }

    fn forget(&self, entry: &Arc<Entry>) {
        let mut holds = self.holds.lock().expect("holds");
        let Some(owners) = holds.get_mut(&entry.name) else {
            return;
        };
        if owners
            .get(&entry.owner)
            .is_some_and(|e| Arc::ptr_eq(e, entry))
        {
            owners.remove(&entry.owner);
            if owners.is_empty() {
                holds.remove(&entry.name);
            }
        }
    }

    /// Every key under `prefix`, oldest first.
    ///
    /// Cancel safety: safe, read-only.
    async fn read_prefix(&self, prefix: &str) -> Result<Vec<KeyValue>> {
        let response = self
            .client
            .range(rpc::by_create(prefix, SortOrder::Ascend))
            .await
            .map_err(|e| backend_error("reading the lock keys", e))?;
        Ok(response.kvs)
    }

    /// Inspection of one lock from its contenders.
    ///
    /// Cancel safety: safe, read-only.
    async fn info(&self, name: &str, all: &[Contender]) -> Option<LockInfo> {
        if all.is_empty() {
            return None;
        }
        let mut holders = Vec::new();
        let mut waiters = Vec::new();
        for contender in all {
            if standing(all, contender.create_revision, contender.mode) == Standing::Holds {
                holders.push(contender);
            } else {
                waiters.push(contender);
            }
        }
        let expiries =
            futures::future::join_all(holders.iter().map(|c| self.lease_expiry(c.lease))).await;
        Some(LockInfo {
            name: name.to_owned(),
            holders: holders
                .into_iter()
                .zip(expiries)
                .map(|(c, lease_expires)| Holder {
                    owner: c.owner(),
                    lock_by: c.meta.as_ref().map(|m| m.lock_by.clone()),
                    lock_time: c.meta.as_ref().map(|m| m.since()),
                    fencing_token: Some(c.create_revision as u64),
                    lease_expires,
                    mode: c.mode,
                    hold_count: c.meta.as_ref().map_or(1, |m| m.count),
                })
                .collect(),
            waiters: waiters
                .into_iter()
                .map(|c| Waiter {
                    owner: c.owner(),
                    mode: c.mode,
                    since: c.meta.as_ref().map(|m| m.since()),
                })
                .collect(),
        })
    }

    /// When a lease runs out unless renewed (`LeaseTimeToLive`).
    ///
    /// Cancel safety: safe, read-only.
    async fn lease_expiry(&self, lease: i64) -> Option<SystemTime> {
        if lease == 0 {
            return None;
        }
        let response = self.client.lease_time_to_live(lease).await.ok()?;
        (response.ttl >= 0).then(|| SystemTime::now() + Duration::from_secs(response.ttl as u64))
    }
}

#[async_trait]
impl Backend for EtcdBackend {
    fn name(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fifo: true,
            lock_delay: false,
            lists_waiters: true,
            shared: true,
            semaphore: true,
            proclaim: true,
            multi_lock: false,
        }
    }

    /// Cancel safety: safe. A dropped acquire deletes its queue key in the
    /// background (or revokes the lease of a leased acquire); until that
    /// delete lands, inspection from this process waits for it.
    async fn acquire(&self, request: &AcquireRequest) -> Result<Option<Grant>> {
        if self.inner.closed.load(Ordering::SeqCst) {
            return Err(Error::Closed);
        }
        self.inner.acquire_one(&request.names[0], request).await
    }

    /// Cancel safety: safe, read-only.
    async fn describe(&self, name: &str) -> Result<Option<LockInfo>> {
        let span = tracing::debug_span!("describe", backend = BACKEND, name);
        async move {
            let prefix = lock_prefix(&self.inner.namespace, name);
            cleanups::settle(&prefix).await;
            let kvs = self.inner.read_prefix(&prefix).await?;
            Ok(self
                .inner
                .info(name, &contenders(&prefix, name, &kvs))
                .await)
        }
        .instrument(span)
        .await
    }

    /// Cancel safety: safe, read-only.
    async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        let span = tracing::debug_span!("list", backend = BACKEND, prefix);
        async move {
            let namespace = &self.inner.namespace;
            let scope = format!("{namespace}{prefix}");
            cleanups::settle(&scope).await;
            let kvs = self.inner.read_prefix(&scope).await?;
            let names: BTreeSet<String> = kvs
                .iter()
                .filter_map(|kv| listed_lock_name(namespace, kv))
                .filter(|name| name.starts_with(prefix))
                .collect();
            let mut infos = Vec::new();
            for name in names {
                let lock = lock_prefix(namespace, &name);
                if let Some(info) = self
                    .inner
                    .info(&name, &contenders(&lock, &name, &kvs))
                    .await
                {
                    infos.push(info);
                }
            }
            Ok(infos)
        }
        .instrument(span)
        .await
    }

    /// Cancel safety: safe; a dropped call closes its watch stream.
    async fn watch_holders(&self, name: &str) -> Result<Option<HolderChanges>> {
        election::watch_holders(&self.inner, name).await.map(Some)
    }

    /// Deletes the keys of the current holders, whoever they are (each delete
    /// guarded by the create revision it saw, retried if the queue moved);
    /// their guards see `lost()` fire through their key watches.
    ///
    /// Cancel safety: the deletes (one transaction) may or may not have happened.
    async fn force_release(&self, name: &str) -> Result<()> {
        let span = tracing::debug_span!("force_release", backend = BACKEND, name);
        async move {
            let prefix = lock_prefix(&self.inner.namespace, name);
            for _ in 0..10 {
                let kvs = self.inner.read_prefix(&prefix).await?;
                let all = contenders(&prefix, name, &kvs);
                let holders: Vec<&Contender> = all
                    .iter()
                    .filter(|c| standing(&all, c.create_revision, c.mode) == Standing::Holds)
                    .collect();
                if holders.is_empty() {
                    return Ok(());
                }
                let txn = TxnRequest {
                    compare: holders
                        .iter()
                        .map(|c| rpc::create_revision_is(c.key.clone(), c.create_revision))
                        .collect(),
                    success: holders
                        .iter()
                        .map(|c| rpc::delete(c.key.clone()).into())
                        .collect(),
                    failure: Vec::new(),
                };
                let response = self
                    .inner
                    .client
                    .txn(txn)
                    .await
                    .map_err(|e| backend_error("deleting the holders' keys", e))?;
                if response.succeeded {
                    tracing::info!(
                        backend = BACKEND,
                        name,
                        holders = holders.len(),
                        "force-released"
                    );
                    return Ok(());
                }
            }
            Err(Error::backend(
                BACKEND,
                format!("{name}: the holders kept changing; force release gave up"),
            ))
        }
        .instrument(span)
        .await
    }

    /// Revokes the session lease (deleting every key on it at once) and the
    /// leases of leased holds; every guard of this client is lost.
    ///
    /// Cancel safety: if dropped midway, the leases not yet revoked expire.
    async fn close(&self) -> Result<()> {
        if self.inner.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let session = self.inner.session.lock().expect("session").clone();
        session.end(LostCause::ClientClosed, "the client was closed");
        let owned: Vec<Arc<Entry>> = self
            .inner
            .holds
            .lock()
            .expect("holds")
            .drain()
            .flat_map(|(_, owners)| owners.into_values())
            .collect();
        let client = &self.inner.client;
        let mut result = client
            .revoke_lease(session.id)
            .await
            .map_err(|e| backend_error("revoking the session lease", e));
        for entry in owned {
            // A hold lost before the close (its lease ran out) may have no
            // lease left to revoke: that failure is no news.
            let lost_before = entry.lost.is_fired();
            entry
                .lost
                .fire_because(LostCause::ClientClosed, "the client was closed");
            if let hold::HoldLease::Own(own) = &entry.lease {
                own.stop();
                if let Err(error) = client.revoke_lease(own.id()).await {
                    if !lost_before {
                        result = result.and(Err(backend_error("revoking a hold's lease", error)));
                    }
                }
            }
        }
        self.inner.shutdown.cancel();
        result
    }
}

impl Drop for EtcdBackend {
    fn drop(&mut self) {
        if self.inner.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        let session = self.inner.session.lock().expect("session").clone();
        session.end(LostCause::ClientClosed, "the client was dropped");
        self.inner.shutdown.cancel();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let client = self.inner.client.clone();
            runtime.spawn(async move {
                let _ = client.revoke_lease(session.id).await;
            });
        }
    }
}

/// Parses `url` as `connect` does, contacting nothing (the fuzz targets'
/// entry, through `crate::fuzzing`).
#[cfg(feature = "fuzzing")]
pub(crate) fn parse_url_only(url: &str, _options: &ConnectOptions) -> Result<()> {
    parse_url(url).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let target = parse_url("etcd://127.0.0.1:2379").unwrap();
        assert_eq!(target.endpoints, ["http://127.0.0.1:2379"]);
        assert_eq!(target.namespace, "");
        assert_eq!(target.user, None);

        let target =
            parse_url("etcd://u:p%40ss@a,b:3000,[::1]:4000/?prefix=locks%2Fprod/").unwrap();
        assert_eq!(
            target.endpoints,
            ["http://a:2379", "http://b:3000", "http://[::1]:4000"]
        );
        assert_eq!(target.namespace, "locks/prod/");
        assert_eq!(target.user, Some(("u".into(), Secret::new("p@ss".into()))));
        assert!(!format!("{target:?}").contains("p@ss"), "{target:?}");
        assert_eq!(target.tls, None);

        let target = parse_url("etcds://a,b:3000?ca=/ca.pem&cert=/c.pem&key=/k.pem").unwrap();
        assert_eq!(target.endpoints, ["https://a:2379", "https://b:3000"]);
        assert_eq!(
            target.tls,
            Some(TlsFiles {
                ca: "/ca.pem".into(),
                identity: Some(("/c.pem".into(), "/k.pem".into())),
            })
        );
        let target = parse_url("etcds://a?ca=/ca.pem&prefix=x").unwrap();
        assert_eq!(target.tls.unwrap().identity, None);

        for bad in [
            "redis://x",
            "etcd://",
            "etcd://a,,b",
            "etcd://a:port",
            "etcd://a/chroot",
            "etcd://a?prefix=",
            "etcd://a?timeout=3",
            "etcd://[::1",
            "etcd://a?ca=/ca.pem",
            "etcds://a",
            "etcds://a?cert=/c.pem&key=/k.pem",
            "etcds://a?ca=/ca.pem&cert=/c.pem",
            "etcds://a?ca=",
        ] {
            assert!(
                matches!(parse_url(bad), Err(Error::InvalidUrl { .. })),
                "{bad} accepted"
            );
        }
    }
}
