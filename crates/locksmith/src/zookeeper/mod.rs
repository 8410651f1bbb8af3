//! `zk://[user:password@]host:port[,host:port…][/chroot][?options]` (`zks://` over TLS): ZooKeeper, in the layouts
//! of Apache Curator's lock recipes, so that locksmith, Curator (Java) and
//! kazoo (Python) clients exclude each other on the same lock.
//!
//! # Layout
//!
//! A lock named `orders/42` is the path `/orders/42` under the URL's chroot
//! (the chroot is created on connect when missing; missing ancestors of a lock
//! path are created as container nodes, which the server removes once empty,
//! as Curator's `creatingParentContainersIfNeeded` does).
//!
//! | lock | nodes (ephemeral sequential, under the lock path) | Curator recipe |
//! |---|---|---|
//! | exclusive | `_c_<uuid>-lock-<seq>` | `InterProcessMutex` |
//! | read-write, reader | `_c_<uuid>-__READ__<seq>` | `InterProcessReadWriteLock` |
//! | read-write, writer | `_c_<uuid>-__WRIT__<seq>` | `InterProcessReadWriteLock` |
//! | semaphore of N | mutex `locks/_c_<uuid>-lock-<seq>`, leases `leases/_c_<uuid>-lease-<seq>`; N as text in the path's data | `InterProcessSemaphoreV2` |
//!
//! The names come from Curator's sources: `InterProcessMutex.LOCK_NAME`,
//! `InterProcessReadWriteLock.READ_LOCK_NAME`/`WRITE_LOCK_NAME`,
//! `InterProcessSemaphoreV2.LOCK_PARENT`/`LEASE_PARENT`/`LEASE_BASE_NAME`, and
//! the `_c_<uuid>-` protection prefix of `ProtectedUtils`; see `layout.rs`.
//!
//! * **Queue.** Contenders are ordered by the ten-digit sequence number
//!   ZooKeeper appends (one counter per lock path), read from the end of a
//!   child whose name puts a recipe's node name before the digits: Curator's
//!   nodes, kazoo's `<hex>__lock__<seq>` and `<hex>__rlock__<seq>`, ZooKeeper's
//!   own `x-<session>-<seq>` (kazoo reads its contenders the same way). Any
//!   other child, such as the path of a lock named `reports/1732780800`, is
//!   no contender. A writer (exclusive) holds when it is first; a reader holds
//!   when no writer is ahead of it (Curator's and kazoo's rules; kazoo's
//!   `__rlock__` counts as a reader, every other contender as a writer). Each waiter watches only the one node whose deletion can change
//!   its answer (its predecessor; for a reader the nearest writer ahead), so a
//!   release wakes one waiter, not the herd. Waiting is FIFO.
//! * **Writers.** An exclusive lock and a read-write lock's writer are the same
//!   request to a backend. The node is `lock-` unless the lock path already has
//!   read-write nodes, in which case it is `__WRIT__`, because Curator's readers
//!   only see `__WRIT__` nodes. Between locksmith clients both names are
//!   writers, so exclusion never depends on that choice; only a Curator reader
//!   racing a locksmith writer on an *empty* path could miss a `lock-` node.
//! * **Protected creation.** Every node starts with `_c_<uuid>-`: after a
//!   connection loss during the create, the client lists the path and finds
//!   its own node by that prefix instead of creating a second one.
//! * **Re-check (CURATOR-604).** After every wake-up and every reconnection a
//!   waiter reads the queue again; when its own node is gone (and the session
//!   lives) it queues again.
//! * **Node data.** The owner id (an election candidate's value), as UTF-8
//!   text: what kazoo stores (its lock `identifier`, returned by
//!   `Lock.contenders()`). Curator stores the client's IP
//!   address by default; inspection shows whatever text is there as the owner.
//!   `lock_by` is the owning session (`session 0x…`; this client's own nodes
//!   also show its name and host), `lock_time` the node's creation time for
//!   other clients' nodes.
//! * **Elections.** A candidate is an exclusive contender whose node data is
//!   its value, which is where Curator's `LeaderSelector` (`getLeader()`)
//!   and kazoo's `Election` (`contenders()`) read a participant's id; the
//!   leader is the first contender. Its node is named as Curator's
//!   `InterProcessMutex` names it unless the URL says `elections=kazoo`:
//!   then `<uuid hex>__lock__<seq>`, as kazoo's `Lock` does. One name cannot
//!   serve both, as kazoo only counts `__lock__<seq>` nodes and Curator sorts
//!   by what follows the last `lock-`. `proclaim` is a `setData` checked
//!   against the version this client last wrote; `observe` watches the
//!   path's children and the first contender's data.
//! * **Fencing token.** The czxid of our node: the zxid of the transaction that
//!   created it, globally monotonic across the ensemble, restarts and leader
//!   changes. Re-entry keeps the node, hence the token.
//! * **Semaphores.** As Curator's `InterProcessSemaphoreV2`: take the `locks`
//!   mutex, create a lease node, wait (still holding the mutex, watching the
//!   leases) until at most N leases exist, release the mutex. The number of
//!   permits is written as decimal text into the semaphore path's data (kazoo's
//!   `Semaphore` convention; Curator leaves it empty and never checks). A
//!   request with a different N while leases are out is `Error::Conflict`;
//!   with none out, the newcomer's N is recorded. A try-acquire fails while
//!   another client is inside the mutex.
//!
//! # Interoperability
//!
//! * **Curator**: same layouts and the same rules; locksmith, `InterProcessMutex`,
//!   `InterProcessReadWriteLock` and `InterProcessSemaphoreV2` share locks.
//! * **kazoo**: locksmith queues behind kazoo's `Lock` (`__lock__`), `ReadLock`
//!   and `WriteLock` nodes. kazoo, for its part, only counts nodes matching its
//!   own names, so a kazoo lock must be told about Curator's:
//!   `zk.Lock(path, identifier, extra_lock_patterns=["-lock-"])` (the option
//!   kazoo has for exactly this, since 2.7.1). Without it kazoo ignores
//!   Curator's and locksmith's nodes. kazoo's `Election` cannot be told:
//!   share an election with it through `?elections=kazoo`.
//!
//! # Sessions, liveness and `lost()`
//!
//! Holds are ephemeral nodes of the client's one ZooKeeper session, kept alive
//! by the ZooKeeper client's pings. The client's session TTL
//! ([`ConnectOptions::session_ttl`]) is the requested session timeout; the
//! server clamps it into its `minSessionTimeout..=maxSessionTimeout` (by
//! default 2 to 20 ticks, 4 s to 40 s). [`Guard::lost`](crate::Guard::lost)
//! fires when the session ends, when the connection stays suspended longer than
//! a part of the session timeout (Curator tech notes 10, 12, 14: a suspended
//! connection is not trusted), when the node is deleted by someone else
//! (`force_release`), or when a fixed lease ends. A lost hold's node is deleted
//! as soon as the connection allows. After a session ends the next operation
//! opens a new one.
//!
//! **Leases are client-enforced**: ZooKeeper has no TTL for ephemeral nodes, so
//! a hold with a fixed lease is deleted by this client when the lease ends
//! (`lost()` fires at that moment) and `extend` moves the deadline. A crashed
//! client's holds end with its session.
//!
//! Lock-delay is not supported (a nonzero `lock_delay` is
//! [`Error::Unsupported`]): nothing is left on the server to enforce it after
//! an abnormal loss.
//!
//! # Cancel safety
//!
//! A dropped (or timed-out) acquire deletes its node. On a multi-thread tokio
//! runtime the drop waits for the delete (at most one second), so once the
//! future is gone, every client sees the queue without it; on a current-thread
//! runtime the delete runs in the background.
//!
//! # URL options
//!
//! | option | default | meaning |
//! |---|---|---|
//! | `session_timeout` | the client's `session_ttl` | requested ZooKeeper session timeout (`500ms`, `10s`, `1m`, or milliseconds) |
//! | `connection_timeout` | a third of the session timeout | silence after which the connection counts as lost and the client tries the next server; a connect tries every server up to three times, within one session timeout |
//! | `lost_after_suspended` | `0.33` | part of the negotiated session timeout the connection may stay suspended before holds are lost (`0`: at once; `never`: only on session expiry) |
//! | `elections` | `curator` | whose election node names this client's candidates take: `curator` (`LeaderSelector`) or `kazoo` (`Election`) |
//! | `auth` | `digest` | how `user:password@` authenticates the session: `digest` (ZooKeeper's `digest` scheme) or `sasl` (SASL DIGEST-MD5 against the users of the server's JAAS `Server` section) |
//! | `acl` | `creator` with credentials, else `anyone` | ACL of the nodes locksmith creates, the chroot included: `creator` (only the creator's credentials, ZooKeeper's `auth` scheme: Curator's and kazoo's `CREATOR_ALL_ACL`), `read` (that, and read for anyone: listing and inspection), `anyone` (`world:anyone`, everything); `creator` and `read` need credentials |
//! | `ca`, `cert`, `key` | | `zks://` only: TLS (rustls) to every server's secure client port (`secureClientPort`). `ca` (required) names the CA file the servers' certificates must chain to (and name the URL's hosts); `cert` and `key` (together) the client certificate, which ZooKeeper asks for by default (`ssl.clientAuth=need`) |
//!
//! Example: `zk://zk1:2181,zk2:2181,zk3:2181/apps/locks?session_timeout=10s`.
//!
//! # Credentials
//!
//! `user:password@` (percent-encode special characters) authenticates the
//! session with ZooKeeper's `digest` scheme, again after every reconnect.
//! Nodes are then creator-only by default, so another client needs the same
//! credentials (kazoo: `auth_data=[("digest", "user:password")]` with
//! `default_acl=CREATOR_ALL_ACL`; Curator: `.authorization("digest", …)`
//! with `ACLProvider` creator-all) to queue on the same lock; one without them
//! gets an error naming the ACL (ZooKeeper's `NoAuth`). Digest
//! authentication cannot fail at connect: a wrong password is another
//! identity, refused by the ACL. The password never appears in errors, logs
//! or `Debug` output.
//!
//! With `?auth=sasl` the same credentials authenticate through SASL
//! DIGEST-MD5 instead, as a ZooKeeper whose `zoo.cfg` names
//! `authProvider.1=org.apache.zookeeper.server.auth.SASLAuthenticationProvider`
//! and whose JAAS `Server` section lists its users
//! (`org.apache.zookeeper.server.auth.DigestLoginModule required
//! user_alice="…";`) expects. A wrong password then fails the connect, and
//! the creator ACLs name `sasl:alice`. Kerberos (GSSAPI) is not built in: it
//! would link the system's Kerberos library into every build.
//!
//! [`ConnectOptions::session_ttl`]: crate::ConnectOptions::session_ttl

mod acquire;
mod config;
mod election;
mod hold;
mod inspect;
mod layout;
mod session;

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use locksmith_core::Mode;
use tokio_util::sync::CancellationToken;

use self::acquire::Node;
use self::config::{Config, Elections};
use self::hold::{HoldState, HoldTable, NewHold, ZkHold};
use self::inspect::View;
use self::session::Session;
use crate::backend::{AcquireRequest, Backend, Capabilities, Grant, HolderChanges, LockInfo};
use crate::error::{Error, Result};
use crate::lost::LostCause;
use crate::options::ConnectOptions;

const BACKEND: &str = "zookeeper";

/// How many times an acquire starts over on a new session after its session
/// ended underneath it.
const SESSION_RETRIES: usize = 3;

/// Locks on a ZooKeeper ensemble, in Curator's layouts (see the module docs).
pub struct ZooKeeperBackend {
    config: Config,
    current: Mutex<Option<Arc<Session>>>,
    reconnect: tokio::sync::Mutex<()>,
    holds: Arc<HoldTable>,
    closed: CancellationToken,
}

impl ZooKeeperBackend {
    /// Connects to the ensemble named by `url` and opens a session.
    ///
    /// Cancel safety: safe; a dropped connect closes the half-made session.
    pub async fn connect(url: &str, options: &ConnectOptions) -> Result<Self> {
        let config = config::parse(url, options)?;
        let session = Session::open(&config).await?;
        Ok(ZooKeeperBackend {
            config,
            current: Mutex::new(Some(session)),
            reconnect: tokio::sync::Mutex::new(()),
            holds: Arc::default(),
            closed: CancellationToken::new(),
        })
    }

    /// The current ZooKeeper session's id (the `ephemeralOwner` of this
    /// client's nodes), if a session is open.
    pub fn session_id(&self) -> Option<i64> {
        self.current().map(|s| s.id)
    }

    /// The current session's client, for what this backend does not cover
    /// (and for tests that need to expire the session).
    pub fn zookeeper(&self) -> Option<zookeeper_client::Client> {
        self.current().map(|s| s.client.clone())
    }

    /// The negotiated session timeout of the current session.
    pub fn session_timeout(&self) -> Option<std::time::Duration> {
        self.current().map(|s| s.timeout)
    }

    fn current(&self) -> Option<Arc<Session>> {
        self.current.lock().expect("session lock").clone()
    }

    /// The live session, opening a new one if the last one ended.
    ///
    /// Cancel safety: safe; a dropped reconnect closes its half-made session.
    async fn session(&self) -> Result<Arc<Session>> {
        if self.closed.is_cancelled() {
            return Err(Error::Closed);
        }
        if let Some(session) = self.current().filter(|s| !s.is_over()) {
            return Ok(session);
        }
        let _one = self.reconnect.lock().await;
        if let Some(session) = self.current().filter(|s| !s.is_over()) {
            return Ok(session);
        }
        if self.closed.is_cancelled() {
            return Err(Error::Closed);
        }
        tracing::info!("ZooKeeper session ended: opening a new one");
        let session = Session::open(&self.config).await?;
        *self.current.lock().expect("session lock") = Some(session.clone());
        Ok(session)
    }

    fn view<'a>(&'a self, session: &'a Session) -> View<'a> {
        View {
            session,
            holds: &self.holds,
            lock_by: &self.config.lock_by,
        }
    }

    /// One attempt on one session.
    ///
    /// Cancel safety: safe; the pending nodes' drop deletes them, and the
    /// hold is made after the last await.
    async fn acquire_on(
        &self,
        session: &Arc<Session>,
        name: &str,
        request: &AcquireRequest,
    ) -> Result<Option<Grant>> {
        let path = layout::lock_path(name);
        // What kazoo's `contenders()` and Curator's `getLeader()` read.
        let data = request
            .published
            .as_ref()
            .unwrap_or(&request.owner)
            .as_bytes();
        let kazoo = request.published.is_some() && self.config.elections == Elections::Kazoo;
        let acquired = match request.mode {
            Mode::Semaphore { permits } => {
                acquire::semaphore(session, name, &path, permits, data, request.wait).await?
            }
            mode => acquire::queue(session, &path, mode, data, request.wait, kazoo).await?,
        };
        let Some((Node { path, czxid }, pending)) = acquired else {
            return Ok(None);
        };
        // The trust of the connection the grant was read on, not of the one
        // the wait began on: a suspension while waiting says nothing about a
        // node that a read after the reconnection found at the head. (An
        // expired session keeps its fired signal, and its node is gone.)
        let trust = session.trust();
        pending.keep();
        let hold = HoldState::start(
            NewHold {
                name: name.to_owned(),
                owner: request.owner.clone(),
                path,
                token: czxid,
                lease: request.lease,
                session: session.clone(),
                trust,
            },
            &self.holds,
        );
        tracing::debug!(lock = %name, owner = %request.owner, token = czxid, "granted");
        Ok(Some(Grant {
            tokens: vec![czxid],
            lost: hold.lost.clone(),
            hold: Box::new(ZkHold {
                hold,
                table: self.holds.clone(),
            }),
        }))
    }
}

#[async_trait]
impl Backend for ZooKeeperBackend {
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

    /// Acquires in the lock path's queue (see the module docs).
    ///
    /// Cancel safety: safe; a dropped acquire deletes its node (waiting for the
    /// delete on a multi-thread runtime), and a grant is only made after the
    /// last await.
    #[tracing::instrument(name = "zookeeper.acquire", skip_all, fields(names = ?request.names, mode = %request.mode, owner = %request.owner))]
    async fn acquire(&self, request: &AcquireRequest) -> Result<Option<Grant>> {
        let name = &request.names[0];
        let mut attempt = 0;
        loop {
            let session = self.session().await?;
            match self.acquire_on(&session, name, request).await {
                Err(error) if session.is_over() && attempt < SESSION_RETRIES => {
                    attempt += 1;
                    tracing::warn!(%error, "session ended during an acquire: starting over");
                }
                other => return other,
            }
        }
    }

    /// Reads the lock path: holders per the queue rules, then waiters in
    /// queue order.
    ///
    /// Cancel safety: safe, read-only.
    #[tracing::instrument(name = "zookeeper.describe", skip(self))]
    async fn describe(&self, name: &str) -> Result<Option<LockInfo>> {
        let session = self.session().await?;
        self.view(&session).describe(name).await
    }

    /// Walks the tree under the prefix's deepest complete path.
    ///
    /// Cancel safety: safe, read-only.
    #[tracing::instrument(name = "zookeeper.list", skip(self))]
    async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        let session = self.session().await?;
        self.view(&session).list(prefix).await
    }

    /// Watches the lock path's children and the first contender's data.
    ///
    /// Cancel safety: safe; dropped watches are simply never awaited.
    async fn watch_holders(&self, name: &str) -> Result<Option<HolderChanges>> {
        let session = self.session().await?;
        election::watch_holders(session, layout::lock_path(name))
            .await
            .map(Some)
    }

    /// Deletes every contender (and semaphore lease) of the lock.
    ///
    /// Cancel safety: some nodes may have been deleted.
    #[tracing::instrument(name = "zookeeper.force_release", skip(self))]
    async fn force_release(&self, name: &str) -> Result<()> {
        let session = self.session().await?;
        self.view(&session).force_release(name).await
    }

    /// Releases every hold of this client (their `lost()` fires with "client
    /// closed") and closes the session.
    ///
    /// Cancel safety: if dropped midway, the remaining nodes end with the
    /// session.
    #[tracing::instrument(name = "zookeeper.close", skip(self))]
    async fn close(&self) -> Result<()> {
        self.closed.cancel();
        let holds = self.holds.drain();
        let mut deletes = Vec::new();
        for hold in &holds {
            if hold.lose(&self.holds, LostCause::ClientClosed, "client closed") {
                deletes.push(hold.session.delete(&hold.path));
            }
        }
        futures::future::join_all(deletes).await;
        self.current.lock().expect("session lock").take();
        Ok(())
    }
}

/// Parses `url` as `connect` does, contacting nothing (the fuzz targets'
/// entry, through `crate::fuzzing`).
#[cfg(feature = "fuzzing")]
pub(crate) fn parse_url_only(url: &str, options: &ConnectOptions) -> Result<()> {
    config::parse(url, options).map(drop)
}
