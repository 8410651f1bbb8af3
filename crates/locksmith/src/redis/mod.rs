//! `redis://`, `rediss://`, `redis+redlock://`, `redis+sentinel://` and
//! `redis+cluster://`: locks in Redis, in the key layouts of Redisson (Java)
//! and redis-py, with fencing tokens.
//!
//! ```no_run
//! # async fn demo() -> locksmith::Result<()> {
//! let client = locksmith::Client::connect("redis://127.0.0.1:6379").await?;
//! let guard = client.lock("orders/42").acquire().await?;
//! let token = guard.fencing_token(); // INCR of redisson_lock_token:{orders/42}
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # URLs and modes
//!
//! | URL | what you get |
//! |---|---|
//! | `redis://[user:pass@]host:port[/db]` | one Redis; Redisson RLock layout |
//! | `rediss://…` | the same over TLS (rustls; the system's roots unless `tls_ca=` names a CA file) |
//! | `redis+redlock://[:pass@]h1:p1,h2:p2,h3:p3[/db]` | Redlock over independent masters |
//! | `redis+sentinel://[:pass@]s1:p1,s2:p2/MASTER[/db]` | the primary the Sentinels name for `MASTER`, followed across failovers ([Sentinel](#sentinel)) |
//! | `redis+cluster://[:pass@]h1:p1,h2:p2` | a Redis Cluster, reached through any of these nodes ([Cluster](#cluster)) |
//! | `rediss+sentinel://…`, `rediss+cluster://…` | the same over TLS (also `tls=true`) |
//!
//! Query options (an unknown option is an error):
//!
//! | option | meaning |
//! |---|---|
//! | `mode=rlock` (default) | exclusive locks in Redisson's RLock hash: re-entrant, not FIFO |
//! | `mode=fair` | the RLock hash plus Redisson RFairLock's queue: FIFO for every mode (not with Redlock) |
//! | `mode=simple` | exclusive locks as `SET name <id> NX PX <ttl>`, the layout of redis-py's `Lock` |
//! | `prefix=app/` | prepend a namespace to every lock name (off by default: names map verbatim) |
//! | `wait_replicas=N&wait_timeout=500ms` | after each grant, `WAIT` for N replicas; if fewer acknowledge in time the grant is given back and the acquire fails with [`Error::Unreplicated`] (Redisson's `checkLockSyncedSlaves`). Default 1 behind Sentinel and on a Cluster, off otherwise; `0` turns it off ([replica acknowledgement](#replica-acknowledgement)) |
//! | `connect_timeout=2s` | how long connecting to one server may take: TCP, TLS and the connection's setup including the subscription connection (default 2s; the Sentinels, and a primary they name until it first answers, are asked within 500ms) |
//! | `node_timeout=50ms` | Redlock: how long one node may take per request (default a tenth of the lease, or of the session TTL for a release, an extension or an inspection; 50ms..1s) |
//! | `retry_delay=100ms` | Redlock: upper bound of the random pause after a split vote |
//! | `tls=true` | Redlock, Sentinel, Cluster: connect to every node with TLS |
//! | `tls_ca=/path/ca.pem` | TLS: trust these CAs instead of the system's |
//! | `tls_cert=/path/c.pem&tls_key=/path/k.pem` | TLS: client certificate (mutual TLS) |
//! | `protocol=resp3` | passed on to the `redis` crate |
//!
//! [`RedisBackend::capabilities`] is honest per mode: `fifo` (and a waiter list
//! in inspection) only with `mode=fair`; shared locks everywhere; semaphores
//! everywhere but Redlock; no lock-delay.
//!
//! # Layout (what is stored where)
//!
//! All names below come from Redisson's sources (see [`keys`] for the exact
//! functions); `{name}` is the lock name with Redisson's hash-tag braces. The
//! lock name maps to the key verbatim, so a Redisson service and a locksmith
//! service using the same name exclude each other.
//!
//! | what | key | type | content |
//! |---|---|---|---|
//! | exclusive hold | `name` | hash | `<client uuid>:<owner>` → re-entry count, `mode` → `write`; `PEXPIRE` lease (Redisson RLock; the `mode` marker makes Redisson's RReadWriteLock see it as write-locked too) |
//! | shared holds | `name` | hash | `mode` → `read`, `<client uuid>:<owner>` → count; per level `n` a key `{name}:<client uuid>:<owner>:rwlock_timeout:<n>` with the lease (Redisson RReadLock) |
//! | simple hold | `name` | string | `<client uuid>:<owner>`, `PX` lease (redis-py `Lock`) |
//! | semaphore | `name` | string | available permits; zset `{name}:timeout`: holder → expiry in Redis ms (Redisson RPermitExpirableSemaphore) |
//! | fencing counter | `redisson_lock_token:{name}` | string | `INCR`ed on every free→held transition, never expires (Redisson RFencedLock) |
//! | fair queue | `redisson_lock_queue:{name}` + `redisson_lock_timeout:{name}` | list + zset | waiter ids in arrival order + their deadlines (Redisson RFairLock) |
//! | metadata | `locksmith_meta:{name}` | hash | holder id → `"<token> <lock time ms> <count> <lock_by>"`; expires with the holds |
//!
//! Re-entry is decided by the client's model layer (module `model`), as on
//! every store: Redis sees one acquire and one release per hold, however deep
//! the owner re-enters, and the client writes the depth it counts into the
//! layout ([`scripts::SET_COUNT`]): the hash field is the hold count, as
//! Redisson's own `getHoldCount` reads it, with one read-hold timeout key per
//! level for a read lock, as Redisson keeps them. Re-entry keeps the token
//! (Redisson's RFencedLock would issue a new one). A holder id found at an
//! acquire is a leftover of a hold the client no longer has (a Redlock
//! release that missed a node, a hold given up as lost); the acquire clears
//! it and grants anew, with a fresh token, and every release names its
//! hold's token, so the release of a hold given up as lost never ends its
//! owner's next one.
//!
//! Releases publish on Redisson's channels with Redisson's message values
//! (`LockPubSub.UNLOCK_MESSAGE = 0`, `READ_UNLOCK_MESSAGE = 1`):
//! `redisson_lock__channel:{name}` for RLock waiters, `redisson_rwlock:{name}`
//! for read-write lock waiters, `redisson_sc:{name}` (the permit count) for
//! semaphore waiters and `redisson_lock__channel:{name}:<waiter id>` for the
//! first waiter of a fair lock.
//!
//! Every read-modify-write is one Lua script ([`scripts`]), loaded once and
//! called by SHA. Scripts read time with Redis's `TIME`, never the client's
//! clock, so client clock skew cannot expire a permit or reorder a queue.
//! Scripts touch several keys of one lock; they all hash to the same cluster
//! slot (the braces in Redisson's names), which is what lets a script run on
//! a Redis Cluster.
//!
//! Interoperability with other clients, concretely:
//!
//! * **Redisson RLock / RFairLock / RReadWriteLock / RPermitExpirableSemaphore**
//!   on the same name: mutual exclusion both ways, and each side's release wakes
//!   the other side's waiters (a Redisson read-write unlock only publishes on
//!   `redisson_rwlock:{name}`, which locksmith waiters do not hear; they catch up
//!   with their bounded re-check). Redisson's fair lock reduces the deadlines of
//!   all queued waiters when it grants; a locksmith waiter that is dropped from
//!   the queue that way re-joins at the end on its next re-check.
//! * **redis-py `Lock`** (and any `SET NX PX` recipe): with `mode=simple` the key
//!   is the very same string, so each side blocks the other; with the hash
//!   layouts a string key also counts as "held by someone else".
//!
//! # Waiting
//!
//! An acquire that must wait subscribes to its lock's release channel (one
//! shared subscription connection per client, see [`pubsub`]), tries once more
//! (a release between the first try and the subscription is not missed), and
//! then sleeps until a release message arrives or until the current hold's
//! remaining TTL (which the acquire script returns) has passed, capped at a
//! third of the client's session TTL. A lost message therefore costs one
//! bounded re-check, never a stall (the failure mode of Redisson issues #1763
//! and #3891). In fair mode each waiter has its own channel and a release wakes
//! exactly the first waiter; queue entries carry deadlines (the waiter's session
//! TTL, Redis time) that waiters refresh at every re-check, so a crashed waiter
//! leaves the queue on its own. A dropped acquire leaves the queue at once.
//!
//! # Liveness
//!
//! A hold without [`crate::Lock::lease`] gets the client's `session_ttl` as its
//! Redis TTL and the [`watchdog`] renews it every third of that, many holds per
//! script call; a hold with a lease simply expires. Either way the guard's
//! `lost()` fires when the hold can no longer be trusted: its lease ran out,
//! the watchdog could not reach Redis within the lease, or Redis no longer has
//! it (expired, force-released, lost in a restart without persistence).
//! Connections reconnect by themselves; after a reconnect the subscriptions are
//! restored, waiters re-check and the watchdog re-checks every hold at once.
//!
//! # Sentinel
//!
//! With `redis+sentinel://` the client asks the Sentinels (in the URL's order)
//! for the primary of `MASTER`, checks with `ROLE` that it is one, and asks
//! again every second, and every 100 ms while commands fail as if the primary
//! moved. After a switch, commands and subscriptions go to the
//! new primary, waiters re-check, and the watchdog re-checks every hold at
//! once: a hold the new primary lacks (the old one died before a replica had
//! it) fires `lost`, instead of lingering until its next renewal. The
//! credentials of the URL are used for the Sentinels and the primary alike,
//! and so is TLS: with `rediss+sentinel://` the Sentinels and the data nodes
//! are all reached over TLS with the same `tls_ca` and client certificate
//! (Sentinels with `tls-port`, and `tls-replication yes` so that they reach
//! the nodes over TLS too, announce the TLS ports).
//!
//! # Cluster
//!
//! With `redis+cluster://` commands go through the `redis` crate's cluster
//! client, which routes each script to the primary of its first key's slot and
//! follows `MOVED`, `ASK` and failovers. All keys and channels of
//! one lock share a slot: Redisson's names already put the lock name in
//! braces. A name with braces of its own must keep that true (`orders{42}`
//! hashes by `42`, which every key of it then does); a name that would split
//! is refused with [`Error::Unsupported`] before any I/O. The watchdog renews
//! per slot (up to 100 holds of one slot per call). Wake-ups use sharded
//! pub/sub on Redis 7 (`SPUBLISH`, `SSUBSCRIBE` on the lock's shard), as
//! Redisson does on a cluster, so Redisson and locksmith waiters hear each
//! other's releases there too; on older versions plain `PUBLISH` reaches
//! every node. Multi-locks over names in different slots take them one by one
//! in sorted order, so two of them never deadlock. `list` scans every primary.
//!
//! # Replica acknowledgement
//!
//! Redis replicates asynchronously: a primary that grants a lock and dies
//! before a replica has it hands the lock out again after the failover,
//! possibly with the same fencing token (the counter's `INCR` is lost too),
//! and a primary that was cut off while the others failed over can grant on
//! its own until it is demoted. Behind Sentinel and on a Cluster every grant
//! therefore waits, by default, until one replica acknowledges it (`WAIT 1`
//! within `wait_timeout`, 1 s by default), in the same pipeline as the grant.
//! Sentinel and Cluster both promote the most up-to-date replica, so it has
//! the grant; a cut-off primary has no replica left to acknowledge, so it
//! grants nothing. One replica rather than all of them: one is enough for
//! that, and a slow replica then costs nothing.
//!
//! When fewer replicas than asked acknowledge in time, the grant is given
//! back before the acquire returns, and the acquire fails with
//! [`Error::Unreplicated`] (never a conflict or a busy answer: nobody else
//! holds the lock). Its text says what happened, for example `lock
//! "jobs/x" was granted on 10.0.0.5:6379 (primary of main) but only 0 of 1
//! replicas acknowledged it within 1s (0 connected to the primary); the
//! grant was given back`; its fields say the same for code. Where the undo
//! itself cannot be confirmed (the primary stopped answering), the error
//! says so and names the lease for which the grant may still hold the
//! lock. A waiting acquire tries again, for up to a session TTL, while
//! another attempt fits in its wait, and then returns that error rather than
//! a timeout; it retries only after a confirmed undo, so it never waits on a
//! grant of its own. The rule lives in one place (`acknowledge`), for
//! Sentinel and Cluster alike.
//!
//! So a primary without any replica (its only replica was just promoted, or
//! every replica is down) grants nothing until a replica is back; holds it
//! already has keep being renewed. That is the price, chosen over
//! Redisson's default, which waits only for the replicas that are connected
//! and so lets exactly such a primary grant alone. Renewals and releases do
//! not wait: a renewal lost in a failover only shortens a hold, which the
//! watchdog's re-check notices. `wait_replicas=0` turns acknowledgement off,
//! for availability over safety; docs/BENCHMARKS.md has its cost and
//! docs/RELIABILITY.md what it prevents.
//!
//! What a user sees while a Sentinel failover re-syncs the replicas, as
//! measured with the testkit's setups (Sentinels that call a primary down
//! after 1 s) on loopback:
//!
//! * **Two replicas, the primary killed**: the Sentinels promote one and
//!   point the other at it, which continues by a partial resync. Grants
//!   resume within about 0.1 s of the promotion; the attempts in between
//!   fail with a connection error while the client moves to the new primary
//!   (its Sentinels are asked every 100 ms once a command failed).
//! * **One replica, the primary killed and restarted**: the promoted
//!   replica has no replica until the old primary is back *and* the
//!   Sentinels have made it a replica, which they do only once it has been
//!   up for 8 s (four of their 2 s announcement periods), followed by a
//!   full sync. Grants resumed about 11 s after the promotion; until then
//!   every acquire fails with `0 of 1 replicas acknowledged it … (0
//!   connected to the primary)`. A primary that stays down leaves such a
//!   setup without grants until a replica is added.
//!
//! A larger data set makes the full sync, and so the wait, longer; a client
//! that must grant through such a window sets `wait_replicas=0` and relies
//! on fencing alone.
//!
//! # Redlock
//!
//! With `redis+redlock://` every acquire goes to all nodes at once; it succeeds
//! when a majority granted it within the validity time `lease − elapsed −
//! drift` (drift = lease × 1% + 2 ms). Otherwise it is released on every node
//! and retried after a random delay. Renewals and extensions count only when a
//! majority confirms them within the current validity. When a majority of nodes
//! cannot be reached, acquires fail with an error saying so. Every call waits
//! for each node at most `node_timeout` (a release, an extension or an
//! inspection by the session TTL's, an acquire by its lease's; `list` each
//! page of its scan, on every node at once): a node that does not answer
//! counts as failed then, so a minority cut off by a partition slows nothing
//! down. A waiter listens
//! for releases on every node and goes on once a majority confirmed its
//! subscription: a release reaches a majority, so one of them tells it.
//!
//! The fencing token comes from a quorum counter: the grant's nodes report
//! their counter, locksmith writes `max + 1` to every node (raising it past a
//! higher counter any node reports), and the grant counts only once a
//! majority stored it and no node that answered kept one at or above it.
//! Any two majorities intersect, so tokens increase from grant to grant;
//! and while the nodes that kept the highest counter answer,
//! a node that lost its data cannot bring a token back.
//!
//! **Limits, plainly** (Martin Kleppmann, "How to do distributed locking",
//! 2016): Redlock's safety rests on timing assumptions: bounded network delay,
//! bounded process pauses, and clocks that advance at about the same rate on
//! every node. A GC pause or a stopped process longer than the lease lets a
//! second client acquire while the first still believes it holds the lock; a
//! node that restarts without its data (no `appendfsync always`), or whose
//! clock jumps, can hand the lock out twice and can lose its counter, after
//! which tokens may repeat. Use the fencing token at the protected resource,
//! run Redis nodes with persistence, and when correctness matters more than
//! latency, prefer a consensus store (the locksmith server, ZooKeeper, etcd).
//! Semaphores are not offered over Redlock: per-node permit counts do not add up
//! to a safe global count.

mod acknowledge;
mod cleanup;
mod cluster;
mod config;
mod describe;
pub mod keys;
mod node;
mod ops;
pub mod pubsub;
pub mod scripts;
mod sentinel;
mod server;
pub mod watchdog;

pub(crate) use self::cleanup::forget as forget_cleanups;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::join_all;
use futures::{StreamExt, TryStreamExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use self::config::{Config, Layout, Topology};
use self::keys::Keys;
use self::node::Node;
use self::ops::{AcquireSpec, Call, Kind, Reply, Target};
use self::pubsub::Subscription;
use self::scripts::Scripts;
use self::server::{failure, is_transient, problem};
use self::watchdog::Watchdog;
use crate::backend::{AcquireRequest, Backend, Capabilities, Grant, Hold, LockInfo, Wait};
use crate::error::{Error, Result, Undo};
use crate::keeper::{clock_drift, Kept, Term};
use crate::options::ConnectOptions;

pub(crate) const BACKEND: &str = "redis";

/// How long inspection waits for this process's own background clean-ups.
const SETTLE: Duration = Duration::from_secs(2);
/// The pause before a waiting acquire tries again after a failed attempt.
const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// How many locks `list` describes at once: each is a call on every master.
const LIST_DESCRIBES_AT_ONCE: usize = 16;

/// A lock store on Redis: one server, or Redlock over several.
///
/// Made by [`crate::Client::connect`] for `redis://`, `rediss://` and
/// `redis+redlock://` URLs; see the [module docs](self) for modes and layouts.
pub struct RedisBackend {
    shared: Arc<Shared>,
}

/// What the backend, its holds and its background tasks share.
pub(crate) struct Shared {
    config: Config,
    nodes: Vec<Node>,
    /// The scripts, publishing the way the nodes' subscriptions listen.
    scripts: &'static Scripts,
    quorum: usize,
    /// Redisson's "connection manager id": the first half of every holder id.
    client_id: String,
    lock_by: String,
    session_ttl: Duration,
    watchdog: Arc<Watchdog>,
    shutdown: CancellationToken,
    closed: AtomicBool,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// The result of one attempt.
enum Attempt {
    Granted(Granted),
    /// Not now; the current hold lasts about `hint`; `split`: no majority either
    /// way (Redlock), so back off randomly.
    Busy {
        hint: Option<Duration>,
        split: bool,
    },
}

struct Granted {
    token: u64,
    /// When the granting request was sent: the lease counts from then.
    sent: Instant,
}

fn random_below(limit: Duration) -> Duration {
    let r = uuid::Uuid::new_v4().as_u128() as u64;
    let ms = limit.as_millis().max(1) as u64;
    Duration::from_millis(r % ms)
}

impl RedisBackend {
    /// Connects to the Redis server (or, for Redlock, to a majority of them)
    /// named by `url`; see the [module docs](self) for the URL options.
    ///
    /// Cancel safety: safe; a dropped connect leaves nothing behind.
    pub async fn connect(url: &str, options: &ConnectOptions) -> Result<Self> {
        let config = Config::parse(url)?;
        let response_timeout =
            Duration::from_secs(5).max(config.wait_timeout + Duration::from_secs(1));
        let watchdog = Arc::new(Watchdog::default());
        let recheck = watchdog.recheck.clone();
        let nodes = match &config.topology {
            Topology::Single => vec![
                Node::server(&config.nodes[0], &config, response_timeout, true, recheck).await?,
            ],
            Topology::Redlock => {
                let mut nodes = Vec::with_capacity(config.nodes.len());
                for url in &config.nodes {
                    nodes.push(
                        Node::server(url, &config, response_timeout, false, recheck.clone())
                            .await?,
                    );
                }
                nodes
            }
            Topology::Sentinel { master } => {
                vec![Node::sentinel(&config, master, response_timeout, recheck).await?]
            }
            Topology::Cluster => vec![Node::cluster(&config, response_timeout, recheck).await?],
        };
        let quorum = config.quorum();
        if config.redlock() {
            let ping = ::redis::cmd("PING");
            let pings = join_all(nodes.iter().map(|node| {
                tokio::time::timeout(Duration::from_secs(2), node.query::<String>(&ping))
            }))
            .await;
            let failures: Vec<String> = pings
                .iter()
                .zip(&nodes)
                .filter_map(|(ping, node)| match ping {
                    Ok(Ok(_)) => None,
                    Ok(Err(e)) => Some(format!("{}: {e}", node.label())),
                    Err(_) => Some(format!("{}: no answer within 2s", node.label())),
                })
                .collect();
            if nodes.len() - failures.len() < quorum {
                return Err(problem(format!(
                    "Redlock needs {quorum} of {} Redis nodes but only {} answered ({})",
                    nodes.len(),
                    nodes.len() - failures.len(),
                    failures.join("; ")
                )));
            }
        }
        let scripts = scripts::scripts(nodes[0].hub.sharded());
        if config.wait_replicas.is_some() {
            // Loaded up front: the WAIT pipeline cannot load on NOSCRIPT as
            // cheaply as a plain call.
            for script in scripts.all() {
                nodes[0]
                    .load(script)
                    .await
                    .map_err(|e| failure("loading the lock scripts", e))?;
            }
        }
        let by_slot = config.topology == Topology::Cluster;
        let shared = Arc::new(Shared {
            quorum,
            nodes,
            scripts,
            client_id: uuid::Uuid::new_v4().to_string(),
            lock_by: format!("{}@{}", options.client_name, options.host),
            session_ttl: options.session_ttl,
            watchdog: watchdog.clone(),
            shutdown: CancellationToken::new(),
            closed: AtomicBool::new(false),
            config,
        });
        tokio::spawn(watchdog::run(
            Arc::downgrade(&shared),
            watchdog,
            shared.shutdown.clone(),
            options.session_ttl,
            quorum,
            by_slot,
        ));
        tracing::debug!(url = %shared.config.display, client = %shared.client_id, "redis backend connected");
        Ok(RedisBackend { shared })
    }

    /// Number of channels this client's waiters listen on right now (on the
    /// first node), to observe that subscriptions are cleaned up.
    pub fn subscribed_channels(&self) -> usize {
        self.shared.nodes[0].hub.listening()
    }

    /// Number of holds the watchdog keeps alive or checks.
    pub fn watched_holds(&self) -> usize {
        self.shared.watchdog.len()
    }

    /// The id this client puts before every owner in Redis (`<id>:<owner>`), as
    /// Redisson puts its connection manager id before thread ids.
    pub fn client_id(&self) -> &str {
        &self.shared.client_id
    }
}

impl Shared {
    fn fair(&self) -> bool {
        self.config.layout == Layout::Fair
    }

    /// The keys of lock `name`; on a cluster they must share a slot.
    fn keys(&self, name: &str) -> Result<Keys> {
        let keys = Keys::new(if self.config.prefix.is_empty() {
            name.to_owned()
        } else {
            format!("{}{name}", self.config.prefix)
        });
        if self.config.topology == Topology::Cluster {
            cluster::one_slot(name, &keys)?;
        }
        Ok(keys)
    }

    fn target(&self, name: &str, owner: &str, kind: Kind) -> Result<Target> {
        Ok(Target {
            name: name.to_owned(),
            keys: Arc::new(self.keys(name)?),
            field: keys::holder_id(&self.client_id, owner),
            kind,
        })
    }

    fn drift(&self, lease: Duration) -> Duration {
        if self.nodes.len() > 1 {
            clock_drift(lease)
        } else {
            Duration::ZERO
        }
    }

    fn node_timeout(&self, lease: Duration) -> Duration {
        self.config.node_timeout.unwrap_or_else(|| {
            (lease / 10).clamp(Duration::from_millis(50), Duration::from_secs(1))
        })
    }

    /// How long each node may take on a call outside an acquire (a
    /// release, an extension, an inspection, a page of `list`'s scan): with
    /// Redlock the node timeout of the session TTL, as an acquire's calls
    /// take that of their lease; a single node is waited for (`None`).
    fn call_limit(&self) -> Option<Duration> {
        (self.nodes.len() > 1).then(|| self.node_timeout(self.session_ttl))
    }

    /// Runs one call on one node.
    ///
    /// Cancel safety: the call may or may not have run.
    async fn run<T: ::redis::FromRedisValue>(
        &self,
        node: usize,
        call: &Call,
        what: &str,
    ) -> Result<T> {
        let node = &self.nodes[node];
        node.eval(call)
            .await
            .map_err(|e| failure(format!("{what} on {}", node.label()), e))
    }

    /// Runs one call on one node, counting it failed once `limit` has
    /// passed without an answer: with Redlock a node that does not answer
    /// (a partition drops its packets) must not hold the call, and the
    /// majority's answer with it, for the connection's response timeout.
    ///
    /// Cancel safety: the call may or may not have run.
    async fn run_within<T: ::redis::FromRedisValue>(
        &self,
        node: usize,
        call: &Call,
        what: &str,
        limit: Duration,
    ) -> Result<T> {
        tokio::time::timeout(limit, self.run(node, call, what))
            .await
            .unwrap_or_else(|_| {
                Err(problem(format!(
                    "{what} on {}: no answer within {limit:?}",
                    self.nodes[node].label()
                )))
            })
    }

    /// Runs one call on one node within [`Shared::call_limit`].
    ///
    /// Cancel safety: the call may or may not have run.
    async fn run_bounded<T: ::redis::FromRedisValue>(
        &self,
        node: usize,
        call: &Call,
        what: &str,
    ) -> Result<T> {
        match self.call_limit() {
            Some(limit) => self.run_within(node, call, what, limit).await,
            None => self.run(node, call, what).await,
        }
    }

    /// One attempt.
    ///
    /// Cancel safety: safe; if the acquire is dropped while the attempt is in
    /// flight, whatever it took is given back.
    async fn attempt(self: &Arc<Self>, target: &Target, spec: &AcquireSpec) -> Result<Attempt> {
        // The model layer never asks for a hold this owner has, so whatever
        // the owner holds on this lock can only come from this attempt: a
        // dropped attempt releases all of it. (The release goes out on the
        // same connection after the acquire, so it cannot overtake it.)
        let mut undo = UndoOnDrop {
            shared: self,
            target,
            armed: true,
        };
        let result = self.attempt_inner(target, spec).await;
        undo.armed = false;
        result
    }

    /// One attempt, on one node or by quorum.
    ///
    /// Cancel safety: not safe by itself (a grant can be lost); [`Shared::attempt`]
    /// wraps it.
    async fn attempt_inner(&self, target: &Target, spec: &AcquireSpec) -> Result<Attempt> {
        if self.nodes.len() == 1 {
            self.attempt_single(target, spec).await
        } else {
            self.attempt_quorum(target, spec).await
        }
    }

    /// One attempt on the single node (with `WAIT` if configured).
    ///
    /// Cancel safety: as [`Shared::attempt_inner`].
    async fn attempt_single(&self, target: &Target, spec: &AcquireSpec) -> Result<Attempt> {
        let call = target.acquire(self.scripts, spec, &self.lock_by, false);
        let sent = Instant::now();
        let reply: Vec<i64> = match self.config.wait_replicas {
            None => self.run(0, &call, "acquire").await?,
            Some(replicas) => {
                let node = &self.nodes[0];
                let (reply, acked): (Vec<i64>, i64) = node
                    .eval_and_wait(&call, replicas, self.config.wait_timeout)
                    .await
                    .map_err(|e| failure(format!("acquire on {}", node.label()), e))?;
                let parsed = Reply::parse(&reply)?;
                if parsed.took() && acked < i64::from(replicas) {
                    return Err(self
                        .refuse_unacknowledged(target, parsed, spec.lease, acked, replicas)
                        .await);
                }
                reply
            }
        };
        let reply = Reply::parse(&reply)?;
        if let Some(error) = reply.refusal(target) {
            return Err(error);
        }
        Ok(match reply {
            Reply::Granted { token, .. } => Attempt::Granted(Granted { token, sent }),
            Reply::Busy { hint_ms } => Attempt::Busy {
                hint: (hint_ms >= 0).then(|| Duration::from_millis(hint_ms as u64)),
                split: false,
            },
            _ => unreachable!("refusals handled above"),
        })
    }

    /// Redlock: all nodes at once, a majority within the validity time.
    ///
    /// Cancel safety: as [`Shared::attempt_inner`].
    async fn attempt_quorum(&self, target: &Target, spec: &AcquireSpec) -> Result<Attempt> {
        let n = self.nodes.len();
        let quorum = self.quorum;
        let per_node = self.node_timeout(spec.lease);
        let drift = self.drift(spec.lease);
        let call = target.acquire(self.scripts, spec, &self.lock_by, true);
        let start = Instant::now();
        let replies = join_all((0..n).map(|i| {
            let call = &call;
            async move {
                match self
                    .run_within::<Vec<i64>>(i, call, "acquire", per_node)
                    .await
                {
                    Ok(reply) => Reply::parse(&reply).map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                }
            }
        }))
        .await;
        let mut took = Vec::new();
        let mut counters = Vec::new();
        let mut hints = Vec::new();
        let mut errors = Vec::new();
        let mut refusals = Vec::new();
        for (i, reply) in replies.into_iter().enumerate() {
            match reply {
                Ok(Reply::Granted { counter, .. }) => {
                    took.push(i);
                    counters.push(counter);
                }
                Ok(Reply::Busy { hint_ms }) => hints.push(hint_ms),
                Ok(refusal) => refusals.push(refusal),
                Err(e) => errors.push(e),
            }
        }
        let within = |at: Instant| spec.lease > at.duration_since(start) + drift;
        // A node that kept a leftover of this owner (a release it never got)
        // cleared it and granted anew, with a fresh token.
        if took.len() >= quorum && within(Instant::now()) {
            let next = counters.iter().copied().max().unwrap_or(0) + 1;
            // Fenced on every node, not only the granting ones: a node that
            // did not grant (a split vote) may be the one that kept the
            // highest counter, when a granting node lost its data.
            let every: Vec<usize> = (0..n).collect();
            let token = self.fence(target, &every, next, spec.lease, per_node).await;
            if let Some(token) = token.filter(|_| within(Instant::now())) {
                return Ok(Attempt::Granted(Granted { token, sent: start }));
            }
        }
        // No majority in time: release everywhere this attempt may have
        // taken the hold.
        let every: Vec<usize> = (0..n).collect();
        let _ = self.release_on(target, &every, None).await;
        if refusals.len() >= quorum {
            return Err(refusals[0].refusal(target).expect("a refusal"));
        }
        if errors.len() > n - quorum {
            return Err(problem(format!(
                "Redlock needs {quorum} of {n} Redis nodes but only {} answered: {}",
                n - errors.len(),
                errors.join("; ")
            )));
        }
        let busy = hints.len() + refusals.len();
        let hint = hints.iter().copied().filter(|&h| h >= 0).min();
        Ok(Attempt::Busy {
            hint: hint.map(|h| Duration::from_millis(h as u64)),
            split: busy < quorum,
        })
    }

    /// Redlock fencing: writes `value` as the token counter on `nodes`,
    /// raising it past any higher counter found; `None` if no majority stored
    /// it above every counter reported.
    ///
    /// Cancel safety: safe; a counter raised by a dropped call only makes later
    /// tokens larger.
    async fn fence(
        &self,
        target: &Target,
        nodes: &[usize],
        mut value: u64,
        lease: Duration,
        per_node: Duration,
    ) -> Option<u64> {
        for _ in 0..3 {
            let call = ops::fence(self.scripts, target, value, lease);
            let answers = join_all(nodes.iter().map(|&i| {
                let call = &call;
                async move { self.run_within::<i64>(i, call, "fence", per_node).await }
            }))
            .await;
            let stored = answers.iter().filter(|a| matches!(a, Ok(-1))).count();
            // A node that answers with its counter kept one at or above
            // `value`: a token that was handed out. The majority that stored
            // `value` may count a node that lost its data (Kleppmann's
            // sequence), so the token goes past every counter reported, not
            // only past a majority's.
            let higher = answers
                .iter()
                .filter_map(|a| match a {
                    Ok(c) if *c >= 0 => Some(*c as u64),
                    _ => None,
                })
                .max();
            match higher {
                None if stored >= self.quorum => return Some(value),
                None => return None,
                Some(higher) => value = value.max(higher + 1),
            }
        }
        None
    }

    /// Releases the hold on the given nodes (only the hold with `token`,
    /// when given); a majority decides.
    ///
    /// Cancel safety: the release may or may not have happened.
    async fn release_on(&self, target: &Target, nodes: &[usize], token: Option<u64>) -> Result<()> {
        let call = target.release(self.scripts, self.fair(), token);
        if let [node] = nodes {
            let name = || target.name.clone();
            return match self.run::<i64>(*node, &call, "release").await? {
                1 => Ok(()),
                -1 => Err(Error::NotHeld { name: name() }),
                _ => Err(Error::NotOwner { name: name() }),
            };
        }
        let answers = join_all(nodes.iter().map(|&i| {
            let call = &call;
            async move { self.run_bounded::<i64>(i, call, "release").await }
        }))
        .await;
        let needed = if nodes.len() == 1 {
            1
        } else {
            self.quorum.min(nodes.len())
        };
        let released = answers.iter().filter(|a| matches!(a, Ok(1))).count();
        if released >= needed {
            return Ok(());
        }
        let not_held = answers.iter().filter(|a| matches!(a, Ok(-1))).count();
        let not_owner = answers.iter().filter(|a| matches!(a, Ok(-2))).count();
        let name = target.name.clone();
        if not_owner >= needed || (not_owner > 0 && not_owner + not_held >= needed) {
            Err(Error::NotOwner { name })
        } else if not_held >= needed {
            Err(Error::NotHeld { name })
        } else {
            Err(answers
                .into_iter()
                .find_map(|a| a.err())
                .unwrap_or_else(|| problem(format!("releasing {name:?}: no majority answered"))))
        }
    }

    /// Records a hold's re-entry depth on every node; a majority decides.
    ///
    /// Cancel safety: the depth may or may not have been recorded.
    async fn set_count(&self, target: &Target, count: u32, token: u64) -> Result<()> {
        let call = target.set_count(self.scripts, count, token);
        let answers = join_all((0..self.nodes.len()).map(|i| {
            let call = &call;
            async move {
                self.run_bounded::<i64>(i, call, "record the hold count")
                    .await
            }
        }))
        .await;
        let recorded = answers.iter().filter(|a| matches!(a, Ok(1))).count();
        let gone = answers.iter().filter(|a| matches!(a, Ok(0 | -2))).count();
        self.by_majority(
            target,
            recorded,
            gone,
            answers,
            "recording the hold count of",
        )
    }

    /// The outcome of a call on every node about a hold of `target`: done
    /// when a majority did it, lost when more nodes than a minority found
    /// the hold gone, else the first node's error.
    fn by_majority<T>(
        &self,
        target: &Target,
        done: usize,
        gone: usize,
        answers: Vec<Result<T>>,
        what: &str,
    ) -> Result<()> {
        if done >= self.quorum {
            return Ok(());
        }
        if gone > self.nodes.len() - self.quorum {
            return Err(Error::Lost(
                format!("lock {:?} is no longer held", target.name).into(),
            ));
        }
        Err(answers
            .into_iter()
            .find_map(|a| a.err())
            .unwrap_or_else(|| problem(format!("{what} {:?}: no majority answered", target.name))))
    }

    /// The watchdog's batch: renew (or check) up to 100 holds on every node.
    ///
    /// Cancel safety: safe; a renewal either happened or did not.
    async fn renew_batch(
        self: Arc<Self>,
        batch: watchdog::Batch,
        limit: Duration,
    ) -> watchdog::BatchResult {
        let sent = Instant::now();
        let call = ops::renew(self.scripts, &batch.targets, &batch.leases, false);
        let replies = join_all((0..self.nodes.len()).map(|i| {
            let call = &call;
            let this = &self;
            async move {
                this.run_within::<Vec<i64>>(i, call, "renew", limit)
                    .await
                    .map_err(|e| e.to_string())
            }
        }))
        .await;
        watchdog::BatchResult {
            sent,
            ids: batch.ids,
            replies,
        }
    }

    /// Extends a leased hold to `lease` from now.
    ///
    /// Cancel safety: safe; the extension either happened or did not.
    async fn extend(&self, target: &Target, id: u64, lease: Duration) -> Result<()> {
        let limit = self.watchdog.trusted_until(id);
        let targets = [target.clone()];
        let leases = [lease.as_millis() as u64];
        let call = ops::renew(self.scripts, &targets, &leases, true);
        let sent = Instant::now();
        let answers = join_all((0..self.nodes.len()).map(|i| {
            let call = &call;
            async move { self.run_bounded::<Vec<i64>>(i, call, "extend").await }
        }))
        .await;
        let held = answers
            .iter()
            .filter(|a| matches!(a, Ok(v) if v.first() == Some(&1)))
            .count();
        let gone = answers
            .iter()
            .filter(|a| matches!(a, Ok(v) if v.first() == Some(&0)))
            .count();
        // An answer past the hold's trust counts as finding it gone.
        let (held, gone) = match limit.is_none_or(|until| Instant::now() < until) {
            true => (held, gone),
            false => (0, self.nodes.len()),
        };
        self.by_majority(target, held, gone, answers, "extending")?;
        self.watchdog.extended(id, sent, lease);
        Ok(())
    }

    /// Subscribes to where releases of `target` are announced, on every node
    /// at once, and goes on once a majority confirmed: a release reaches a
    /// majority of the nodes, so at least one of them announces it where
    /// this waiter listens. Waiting for every node instead held a Redlock
    /// waiter up for seconds per node that was down.
    ///
    /// Cancel safety: safe; dropped listeners unsubscribe.
    async fn listen(&self, target: &Target) -> Vec<Subscription> {
        let channel = target.wait_channel(self.fair());
        let (subscriptions, confirmations): (Vec<_>, Vec<_>) = self
            .nodes
            .iter()
            .map(|node| node.hub.listen(&channel))
            .unzip();
        pubsub::confirm_in_time(&channel, confirmations, self.quorum).await;
        subscriptions
    }

    /// How long to wait before the next attempt.
    fn pause(&self, hint: Option<Duration>, split: bool) -> Duration {
        let cap = self.session_ttl / 3;
        if split {
            return random_below(self.config.retry_delay);
        }
        let base = hint.unwrap_or(cap).min(cap).max(Duration::from_millis(1));
        if self.nodes.len() > 1 {
            base + random_below(self.config.retry_delay.min(base))
        } else {
            base
        }
    }

    /// Acquires one name, waiting as the request says.
    ///
    /// Cancel safety: safe; a dropped acquire leaves no hold and no queue entry
    /// (undo work is spawned and tracked, see [`cleanup`]).
    async fn acquire_one(self: &Arc<Self>, request: &AcquireRequest) -> Result<Option<Grant>> {
        let name = &request.names[0];
        let kind = Kind::of(request.mode, self.config.layout);
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        let target = self.target(name, &request.owner, kind)?;
        let waiting = request.wait != Wait::No;
        let spec = AcquireSpec {
            lease: request.lease.unwrap_or(self.session_ttl),
            watched: request.lease.is_none(),
            wait: waiting,
            fair: self.fair(),
            waiter_ttl: self.session_ttl,
        };
        let mut queued = QueueSlot {
            shared: self.clone(),
            target: target.clone(),
            armed: false,
        };
        let mut listeners: Option<Vec<Subscription>> = None;
        let mut trouble_since: Option<Instant> = None;
        let deadline = match request.wait {
            Wait::For(limit) => Some(Instant::now() + limit),
            Wait::No | Wait::Forever => None,
        };
        loop {
            for listener in listeners.iter_mut().flatten() {
                listener.mark();
            }
            // An attempt may queue us: from here on a drop must leave the queue.
            queued.armed = spec.fair && waiting;
            let began = Instant::now();
            let attempt = match self.attempt(&target, &spec).await {
                Ok(attempt) => {
                    trouble_since = None;
                    attempt
                }
                Err(Error::Unreplicated(error)) if waiting && error.undo == Undo::GivenBack => {
                    // The replicas are missing or behind (a failover
                    // re-syncing them): try again, for up to a session TTL,
                    // while another attempt fits in the caller's wait. Past
                    // that the caller learns why, not a bare timeout.
                    let since = *trouble_since.get_or_insert_with(Instant::now);
                    let next_ends = Instant::now() + began.elapsed() + RETRY_PAUSE;
                    if since.elapsed() > self.session_ttl
                        || deadline.is_some_and(|deadline| next_ends >= deadline)
                    {
                        return Err(Error::Unreplicated(error));
                    }
                    tracing::debug!(lock = %name, %error, "grant not acknowledged; retrying");
                    tokio::time::sleep(RETRY_PAUSE).await;
                    continue;
                }
                Err(error) if waiting && is_transient(&error) => {
                    // Redis is restarting or unreachable: keep trying for up
                    // to a session TTL (the caller's wait limit still applies).
                    let since = *trouble_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > self.session_ttl {
                        return Err(error);
                    }
                    tracing::debug!(lock = %name, %error, "acquire attempt failed; retrying");
                    tokio::time::sleep(RETRY_PAUSE).await;
                    continue;
                }
                Err(error) => return Err(error),
            };
            match attempt {
                Attempt::Granted(granted) => {
                    queued.armed = false;
                    if kind.admits_more() {
                        for listener in listeners.iter().flatten() {
                            listener.pass_on();
                        }
                    }
                    return Ok(Some(self.grant(target, &spec, granted)));
                }
                Attempt::Busy { .. } if !waiting => return Ok(None),
                Attempt::Busy { hint, split } => {
                    let Some(listening) = listeners.as_mut() else {
                        listeners = Some(self.listen(&target).await);
                        continue;
                    };
                    let pause = self.pause(hint, split);
                    let woken = futures::future::select_all(
                        listening.iter_mut().map(|l| Box::pin(l.woken())),
                    );
                    tokio::select! {
                        _ = woken => {}
                        _ = tokio::time::sleep(pause) => {}
                    }
                }
            }
        }
    }

    fn grant(self: &Arc<Self>, target: Target, spec: &AcquireSpec, granted: Granted) -> Grant {
        let what = format!("lock {:?}", target.name);
        let mut term = if spec.watched {
            Term::renewed(what, Kept::Hold, granted.sent, spec.lease)
        } else {
            Term::fixed(what, Kept::Hold, granted.sent, spec.lease)
        };
        if self.nodes.len() > 1 {
            term = term.with_clock_drift();
        }
        let (id, lost) = self.watchdog.register(&target, term);
        tracing::debug!(lock = %target.name, token = granted.token, "redis lock granted");
        Grant {
            tokens: vec![granted.token],
            lost,
            hold: Box::new(RedisHold {
                shared: self.clone(),
                target,
                id,
                token: granted.token,
            }),
        }
    }
}

/// Gives back everything a fresh owner holds on a lock when an attempt is
/// dropped midway.
struct UndoOnDrop<'a> {
    shared: &'a Arc<Shared>,
    target: &'a Target,
    armed: bool,
}

impl Drop for UndoOnDrop<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (shared, target) = (self.shared.clone(), self.target.clone());
        cleanup::spawn(async move {
            let nodes: Vec<usize> = (0..shared.nodes.len()).collect();
            let _ = shared.release_on(&target, &nodes, None).await;
        });
    }
}

/// A fair-queue place that a dropped or failed acquire gives up.
struct QueueSlot {
    shared: Arc<Shared>,
    target: Target,
    armed: bool,
}

impl Drop for QueueSlot {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (shared, target) = (self.shared.clone(), self.target.clone());
        cleanup::spawn(async move {
            let call = target.leave_queue(shared.scripts);
            for i in 0..shared.nodes.len() {
                if let Err(error) = shared.run::<i64>(i, &call, "leave queue").await {
                    tracing::debug!(lock = %target.name, %error, "could not leave the fair queue; its deadline will drop it");
                }
            }
        });
    }
}

/// A live hold.
struct RedisHold {
    shared: Arc<Shared>,
    target: Target,
    id: u64,
    token: u64,
}

#[async_trait]
impl Hold for RedisHold {
    /// Cancel safety: if dropped midway, the release may or may not have
    /// happened; the hold is off the watchdog from the first poll, so one
    /// left behind is no longer renewed and expires with its lease.
    #[tracing::instrument(level = "debug", name = "redis_release", skip_all, fields(lock = %self.target.name))]
    async fn release(self: Box<Self>) -> Result<()> {
        // Stop renewing first, so a release that fails midway leaves a hold that
        // simply expires.
        let trusted = self.shared.watchdog.release(self.id);
        let nodes: Vec<usize> = (0..self.shared.nodes.len()).collect();
        let token = Some(self.token);
        let result = self.shared.release_on(&self.target, &nodes, token).await;
        tracing::debug!(lock = %self.target.name, ok = result.is_ok(), "redis lock released");
        if !trusted {
            // Lost already (its lease ran out by the local, conservative clock):
            // the release above only tidies up what Redis may still hold.
            return Err(Error::Lost(
                format!("lock {:?} was lost before its release", self.target.name).into(),
            ));
        }
        result
    }

    /// Cancel safety: safe; the extension either happened or did not (see
    /// `Shared::extend`).
    #[tracing::instrument(level = "debug", name = "redis_extend", skip_all, fields(lock = %self.target.name, ?lease))]
    async fn extend(&self, lease: Duration) -> Result<()> {
        self.shared.extend(&self.target, self.id, lease).await
    }

    /// Writes the depth where the layout keeps one: the hash field of
    /// Redisson's RLock and read lock (which Redisson's own `getHoldCount`
    /// reads) and locksmith's metadata.
    ///
    /// Cancel safety: safe; the depth was recorded or it was not.
    #[tracing::instrument(level = "debug", name = "redis_record_count", skip_all, fields(lock = %self.target.name, count))]
    async fn record_count(&self, count: u32) -> Result<()> {
        self.shared.set_count(&self.target, count, self.token).await
    }
}

#[async_trait]
impl Backend for RedisBackend {
    fn name(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        let fair = self.shared.fair();
        Capabilities {
            fifo: fair,
            lock_delay: false,
            lists_waiters: fair,
            shared: true,
            semaphore: self.shared.nodes.len() == 1,
            proclaim: false,
            multi_lock: false,
        }
    }

    /// Cancel safety: safe, as `Shared::acquire_one`: a dropped acquire gives
    /// back whatever its attempt took and leaves the fair queue, in tracked
    /// background tasks; the grant is made after the last await.
    async fn acquire(&self, request: &AcquireRequest) -> Result<Option<Grant>> {
        self.shared.acquire_one(request).await
    }

    /// Cancel safety: safe, read-only.
    #[tracing::instrument(level = "debug", name = "redis_describe", skip(self))]
    async fn describe(&self, name: &str) -> Result<Option<LockInfo>> {
        cleanup::settle(SETTLE).await;
        let shared = &self.shared;
        let keys = shared.keys(name)?;
        let call = Call::new(
            &shared.scripts.describe,
            &[
                &keys.lock,
                &keys.meta,
                &keys.queue,
                &keys.queue_deadlines,
                &keys.permits,
            ],
        );
        if shared.nodes.len() == 1 {
            let reply: ::redis::Value = shared.run(0, &call, "describe").await?;
            return Ok(describe::lock_info(name, &reply));
        }
        let views = join_all((0..shared.nodes.len()).map(|i| {
            let call = &call;
            async move {
                shared
                    .run_bounded::<::redis::Value>(i, call, "describe")
                    .await
            }
        }))
        .await;
        let answered = views.iter().filter(|v| v.is_ok()).count();
        if answered < shared.quorum {
            return Err(views
                .into_iter()
                .find_map(|v| v.err())
                .unwrap_or_else(|| problem("describe: no majority answered")));
        }
        let views = views
            .into_iter()
            .filter_map(|v| v.ok())
            .map(|v| describe::lock_info(name, &v))
            .collect();
        Ok(describe::agreed(name, views, shared.quorum))
    }

    /// Cancel safety: safe, read-only.
    #[tracing::instrument(level = "debug", name = "redis_list", skip(self))]
    async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        cleanup::settle(SETTLE).await;
        let shared = &self.shared;
        let full = format!("{}{prefix}", shared.config.prefix);
        let mut pattern = String::with_capacity(full.len() + 1);
        for c in full.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                pattern.push('\\');
            }
            pattern.push(c);
        }
        pattern.push('*');
        // Every master is scanned at once, each page within the call limit:
        // with Redlock a silent master is passed over after that. A lock a
        // majority holds is on a master that answers.
        let page_limit = shared.call_limit();
        let scans = join_all(
            shared
                .nodes
                .iter()
                .map(|node| node.scan(&pattern, page_limit)),
        )
        .await;
        let mut names = std::collections::BTreeSet::new();
        for (node, scan) in shared.nodes.iter().zip(scans) {
            let keys = match scan {
                Ok(keys) => keys,
                Err(e) if shared.nodes.len() > 1 => {
                    tracing::debug!(node = %node.label(), error = %e, "list skips an unreachable node");
                    continue;
                }
                Err(e) => return Err(failure("listing locks", e)),
            };
            for key in keys {
                if keys::is_helper_key(&key) {
                    continue;
                }
                if let Some(name) = key.strip_prefix(&shared.config.prefix) {
                    if locksmith_core::validate_name(name).is_ok() {
                        names.insert(name.to_owned());
                    }
                }
            }
        }
        // Described a few at a time, in the names' order.
        let described: Vec<Option<LockInfo>> = futures::stream::iter(names)
            .map(|name| async move { self.describe(&name).await })
            .buffered(LIST_DESCRIBES_AT_ONCE)
            .try_collect()
            .await?;
        Ok(described.into_iter().flatten().collect())
    }

    /// Cancel safety: the release may or may not have happened (with Redlock,
    /// on some nodes only); dropped before the answers, this client's own
    /// holds of the lock are not marked lost yet (the watchdog finds them
    /// gone at its next check).
    #[tracing::instrument(level = "debug", name = "redis_force_release", skip(self))]
    async fn force_release(&self, name: &str) -> Result<()> {
        let shared = &self.shared;
        let keys = shared.keys(name)?;
        let call = Call::new(
            &shared.scripts.force_release,
            &[
                &keys.lock,
                &keys.meta,
                &keys.permits,
                &keys.channel,
                &keys.rw_channel,
                &keys.sem_channel,
                &keys.queue,
                &keys.queue_deadlines,
            ],
        );
        let answers = join_all((0..shared.nodes.len()).map(|i| {
            let call = &call;
            async move { shared.run_bounded::<i64>(i, call, "force release").await }
        }))
        .await;
        shared
            .watchdog
            .lose_lock(&keys.lock, &format!("lock {name:?} was force-released"));
        let ok = answers.iter().filter(|a| a.is_ok()).count();
        if ok >= shared.quorum.min(shared.nodes.len()) {
            tracing::info!(lock = %name, "redis lock force-released");
            Ok(())
        } else {
            Err(answers
                .into_iter()
                .find_map(|a| a.err())
                .unwrap_or_else(|| problem("force release: no majority answered")))
        }
    }

    /// Cancel safety: every hold leaves the watchdog (its `lost()` fires) at
    /// the first poll. If dropped midway, the holds not yet released are no
    /// longer renewed and expire with their leases, the undo work of dropped
    /// acquires runs on in the background, and the background tasks stop
    /// only when the backend is dropped.
    #[tracing::instrument(level = "debug", name = "redis_close", skip_all)]
    async fn close(&self) -> Result<()> {
        let shared = &self.shared;
        shared.closed.store(true, Ordering::Release);
        let held = shared.watchdog.drain("client closed");
        let nodes: Vec<usize> = (0..shared.nodes.len()).collect();
        let mut first_error = None;
        for target in held {
            if let Err(error) = shared.release_on(&target, &nodes, None).await {
                if !matches!(error, Error::NotHeld { .. } | Error::NotOwner { .. }) {
                    first_error.get_or_insert(error);
                }
            }
        }
        // The undo work of dropped acquires goes out before the caller
        // (often a process about to exit) moves on.
        cleanup::settle(SETTLE).await;
        shared.shutdown.cancel();
        for node in &shared.nodes {
            node.hub.close();
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Parses `url` as `connect` does, contacting nothing (the fuzz targets'
/// entry, through `crate::fuzzing`).
#[cfg(feature = "fuzzing")]
pub(crate) fn parse_url_only(url: &str, _options: &ConnectOptions) -> Result<()> {
    Config::parse(url).map(drop)
}
