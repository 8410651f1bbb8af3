//! The backends under measurement: given by URL, or started here.
//!
//! `locksmith-lab bench` and `locksmith-lab torture` measure every store through the
//! public client API (`Client::connect_with`), so a backend is nothing but a URL
//! plus, when this process started the server itself, a handle on that server:
//! its pid (for memory figures), and kill / restart / pause (for faults).
//! Stores are started by `locksmith-testkit` exactly as the tests start them
//! (loopback port, temporary directory, killed with this process); the
//! locksmith server is the `locksmith` executable run as `locksmith serve`.

use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use std::sync::Arc;

use locksmith::{Client, ConnectOptions};
use locksmith_testkit::netns::Network;
use locksmith_testkit::{
    Etcd, EtcdCluster, Postgres, Process, Redis, RedisCluster, RedisSentinel, Server, ZooKeeper,
    ZooKeeperEnsemble,
};

pub use super::serve_process::{Placement, ServeCluster, ServeProcess};
use serde::Serialize;

/// The kinds of store `--spawn` can start, and the kind of any `--backend` URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// The locksmith lock server (`locksmith://`).
    Server,
    /// `locksmith://` over a 3-member cluster of the lock server.
    ServerCluster,
    /// `locksmith+tls://` over a 3-member cluster with TLS, members
    /// certified by a CA of the run, and authentication on.
    ServerClusterTls,
    /// In-process engine (`memory://`).
    Memory,
    /// `redis://`.
    Redis,
    /// `redis+sentinel://`: a primary with 2 replicas and 3 Sentinels.
    RedisSentinel,
    /// `redis+cluster://`: 3 primaries with a replica each.
    RedisCluster,
    /// `redis+redlock://`: 5 independent masters.
    Redlock,
    /// `zk://`.
    ZooKeeper,
    /// `zk://` over a 3-server ensemble.
    ZooKeeperEnsemble,
    /// `etcd://`.
    Etcd,
    /// `etcd://` over a 3-member cluster.
    EtcdCluster,
    /// `postgres://`.
    Postgres,
}

impl Kind {
    /// Every single-server kind, in report order (the reference, the server,
    /// first): what `--spawn all` starts. Replicated setups are named one by one.
    pub const ALL: [Kind; 6] = [
        Kind::Server,
        Kind::Memory,
        Kind::Redis,
        Kind::ZooKeeper,
        Kind::Etcd,
        Kind::Postgres,
    ];

    /// The kind of store a URL names, from its scheme.
    pub fn of_url(url: &str) -> Option<Kind> {
        let scheme = url.split_once("://")?.0;
        Some(match scheme {
            "locksmith" | "locksmith+tls" => Kind::Server,
            "memory" => Kind::Memory,
            "redis" | "rediss" => Kind::Redis,
            "redis+sentinel" | "rediss+sentinel" => Kind::RedisSentinel,
            "redis+cluster" | "rediss+cluster" => Kind::RedisCluster,
            "redis+redlock" => Kind::Redlock,
            "zk" | "zks" | "zookeeper" => Kind::ZooKeeper,
            "etcd" | "etcds" => Kind::Etcd,
            "postgres" | "postgresql" => Kind::Postgres,
            _ => return None,
        })
    }

    /// Whether starting it runs the `locksmith` executable.
    pub fn runs_locksmith(self) -> bool {
        matches!(
            self,
            Kind::Server | Kind::ServerCluster | Kind::ServerClusterTls
        )
    }

    /// The short name used in tables and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Server => "server",
            Kind::ServerCluster => "server-cluster",
            Kind::ServerClusterTls => "server-cluster-tls",
            Kind::Memory => "memory",
            Kind::Redis => "redis",
            Kind::RedisSentinel => "redis-sentinel",
            Kind::RedisCluster => "redis-cluster",
            Kind::Redlock => "redlock",
            Kind::ZooKeeper => "zookeeper",
            Kind::ZooKeeperEnsemble => "zookeeper-ensemble",
            Kind::Etcd => "etcd",
            Kind::EtcdCluster => "etcd-cluster",
            Kind::Postgres => "postgres",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Kind {
    type Err = String;

    fn from_str(text: &str) -> Result<Kind, String> {
        match text {
            "server" | "locksmith" => Ok(Kind::Server),
            "server-cluster" => Ok(Kind::ServerCluster),
            "server-cluster-tls" => Ok(Kind::ServerClusterTls),
            "memory" => Ok(Kind::Memory),
            "redis" => Ok(Kind::Redis),
            "redis-sentinel" => Ok(Kind::RedisSentinel),
            "redis-cluster" => Ok(Kind::RedisCluster),
            "redlock" => Ok(Kind::Redlock),
            "zookeeper" | "zk" => Ok(Kind::ZooKeeper),
            // A ZooKeeper "cluster" is what its own docs call an ensemble.
            "zookeeper-ensemble" | "zk-ensemble" | "zookeeper-cluster" | "zk-cluster" => {
                Ok(Kind::ZooKeeperEnsemble)
            }
            "etcd" => Ok(Kind::Etcd),
            "etcd-cluster" => Ok(Kind::EtcdCluster),
            "postgres" | "postgresql" | "pg" => Ok(Kind::Postgres),
            other => Err(format!(
                "unknown backend {other:?}: expected server, server-cluster, server-cluster-tls, memory, redis, redis-sentinel, \
                 redis-cluster, redlock, zookeeper, zookeeper-ensemble, etcd, etcd-cluster or postgres"
            )),
        }
    }
}

/// Parses a comma-separated `--spawn` list; `all` means every kind.
pub fn parse_kinds(text: &str) -> Result<Vec<Kind>, String> {
    let mut kinds = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if part == "all" {
            kinds.extend(Kind::ALL);
        } else {
            kinds.push(part.parse()?);
        }
    }
    kinds.sort();
    kinds.dedup();
    if kinds.is_empty() {
        return Err("name at least one backend".into());
    }
    Ok(kinds)
}

/// Checks, before anything starts, that what `kinds` need to start is here:
/// the `locksmith` executable for the lock server (a store missing from the
/// machine is told of when it starts, with the package to install).
pub fn check_can_spawn(kinds: &[Kind]) -> Result<(), String> {
    if kinds.iter().any(|kind| kind.runs_locksmith()) {
        crate::server_executable::path()?;
    }
    Ok(())
}

/// A `--backend` argument: `URL` or `label=URL`.
#[derive(Debug, Clone)]
pub struct BackendSpec {
    /// Name in the report.
    pub label: String,
    /// Lock store URL.
    pub url: String,
}

impl FromStr for BackendSpec {
    type Err = String;

    fn from_str(text: &str) -> Result<BackendSpec, String> {
        let (label, url) = match text.split_once('=') {
            Some((label, url)) if !label.contains("://") && !label.is_empty() => {
                (label.to_owned(), url.to_owned())
            }
            _ => (String::new(), text.to_owned()),
        };
        let kind = Kind::of_url(&url).ok_or_else(|| {
            format!("{url:?} is not a lock store URL (locksmith://, redis://, redis+sentinel://, redis+cluster://, redis+redlock://, zk://, etcd://, postgres://, memory://)")
        })?;
        let label = if label.is_empty() {
            kind.name().to_owned()
        } else {
            label
        };
        Ok(BackendSpec { label, url })
    }
}

/// One backend in a run.
pub struct Target {
    /// Name in the report (unique within a run).
    pub label: String,
    /// What kind of store it is.
    pub kind: Kind,
    /// The URL clients connect to.
    pub url: String,
    /// The server(s), when this run started them (shared by the targets that
    /// measure one setup with different client settings).
    pub spawned: Option<Arc<Spawned>>,
    /// Settings this run changed from the server's defaults, and why.
    pub tuning: Vec<String>,
    /// Whether another target measures the same servers first (so memory
    /// figures, which the servers keep after the locks are gone, are that
    /// target's).
    pub twin: bool,
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("label", &self.label)
            .field("url", &self.url)
            .field("spawned", &self.spawned.is_some())
            .finish()
    }
}

impl Target {
    /// A backend given by URL; nothing is started.
    pub fn given(spec: BackendSpec) -> Target {
        let kind = Kind::of_url(&spec.url).expect("validated by the argument parser");
        Target {
            label: spec.label,
            kind,
            url: spec.url,
            spawned: None,
            tuning: Vec::new(),
            twin: false,
        }
    }

    /// Starts a real server of `kind` (blocking: a JVM or `initdb` takes
    /// seconds; call it from a blocking thread), a replicated setup's
    /// members placed as `placement` says (single servers and Redlock ignore
    /// it). `memory` starts nothing.
    pub fn spawn_placed(kind: Kind, placement: Placement) -> Result<Target, String> {
        let on_hosts = placement.separate_hosts;
        let spawned = match kind {
            Kind::Memory => None,
            Kind::Server => Some(Spawned::Serve(ServeProcess::start()?)),
            Kind::ServerCluster => Some(Spawned::ServeCluster(ServeCluster::start(3, placement)?)),
            Kind::ServerClusterTls => Some(Spawned::ServeCluster(ServeCluster::start(
                3,
                Placement {
                    secured: true,
                    ..placement
                },
            )?)),
            Kind::Redis => Some(Spawned::Redis(
                Redis::try_start().map_err(|e| e.to_string())?,
            )),
            Kind::RedisSentinel => Some(Spawned::RedisSentinel(
                if on_hosts {
                    RedisSentinel::try_start_on_hosts()
                } else {
                    RedisSentinel::try_start()
                }
                .map_err(|e| e.to_string())?,
            )),
            Kind::RedisCluster => Some(Spawned::RedisCluster(
                if on_hosts {
                    RedisCluster::try_start_on_hosts()
                } else {
                    RedisCluster::try_start()
                }
                .map_err(|e| e.to_string())?,
            )),
            Kind::Redlock => Some(Spawned::Redlock(
                (0..REDLOCK_MASTERS)
                    .map(|_| Redis::try_start())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| e.to_string())?,
            )),
            Kind::ZooKeeper => Some(Spawned::ZooKeeper(
                ZooKeeper::try_start().map_err(|e| e.to_string())?,
            )),
            Kind::ZooKeeperEnsemble => Some(Spawned::ZooKeeperEnsemble(
                if on_hosts {
                    ZooKeeperEnsemble::try_start_on_hosts()
                } else {
                    ZooKeeperEnsemble::try_start()
                }
                .map_err(|e| e.to_string())?,
            )),
            Kind::Etcd => Some(Spawned::Etcd(Etcd::try_start().map_err(|e| e.to_string())?)),
            Kind::EtcdCluster => Some(Spawned::EtcdCluster(
                if on_hosts {
                    EtcdCluster::try_start_on_hosts()
                } else {
                    EtcdCluster::try_start()
                }
                .map_err(|e| e.to_string())?,
            )),
            Kind::Postgres => Some(Spawned::Postgres(
                Postgres::try_start().map_err(|e| e.to_string())?,
            )),
        };
        let spawned = spawned.map(Arc::new);
        let url = match &spawned {
            Some(server) => server.url(),
            None => format!("memory://locksmith-bench-{}", std::process::id()),
        };
        Ok(Target {
            label: kind.name().to_owned(),
            kind,
            url,
            spawned,
            tuning: Vec::new(),
            twin: false,
        })
    }

    /// The same Sentinel setup or Redis Cluster, reached by clients that do
    /// not wait for a replica after a grant (`wait_replicas=0`), labelled
    /// `…-nowait`: measured or tortured beside the default, it shows what
    /// replica acknowledgement costs and what it prevents. `None` for other
    /// kinds.
    pub fn without_replica_wait(&self) -> Option<Target> {
        if !matches!(self.kind, Kind::RedisSentinel | Kind::RedisCluster) {
            return None;
        }
        let mut tuning = self.tuning.clone();
        tuning.push(
            "clients connect with `wait_replicas=0`: grants do not wait for a replica".into(),
        );
        Some(Target {
            label: format!("{}-nowait", self.label),
            kind: self.kind,
            url: locksmith_testkit::with_query(&self.url, "wait_replicas=0"),
            spawned: self.spawned.clone(),
            tuning,
            twin: true,
        })
    }

    /// Makes a server this run started able to hold `locks` locks at once
    /// where its defaults would refuse them (blocking: it may restart the
    /// server). PostgreSQL keeps every held advisory lock in a shared lock
    /// table of `max_locks_per_transaction × max_connections` slots (64 × 200
    /// by default), so the bench raises `max_locks_per_transaction`, as anyone
    /// holding that many locks in production must. Other stores need nothing.
    pub fn make_room_for_locks(&mut self, locks: u64) -> Result<(), String> {
        let Some(Spawned::Postgres(pg)) = self.spawned.as_deref() else {
            return Ok(());
        };
        let connections: u64 = pg
            .query("show max_connections")
            .map_err(|e| e.to_string())?
            .parse()
            .map_err(|e| format!("max_connections: {e}"))?;
        // Room for the other scenarios' locks and PostgreSQL's own beside them.
        let slots = locks + locks / 5 + 10_000;
        let per_connection = slots.div_ceil(connections).next_power_of_two().max(64);
        if per_connection == 64 {
            return Ok(());
        }
        pg.query(&format!(
            "alter system set max_locks_per_transaction = {per_connection}"
        ))
        .map_err(|e| e.to_string())?;
        pg.try_restart().map_err(|e| e.to_string())?;
        self.tuning.push(format!(
            "`max_locks_per_transaction={per_connection}` so that its lock table holds the scale \
             scenario's {locks} advisory locks"
        ));
        Ok(())
    }

    /// Connects a new client (its own connection and session).
    ///
    /// Cancel safety: safe, as `Client::connect_with`.
    pub async fn connect(&self, session_ttl: Duration, role: &str) -> locksmith::Result<Client> {
        let options = ConnectOptions::default()
            .session_ttl(session_ttl)
            .client_name(format!("locksmith {role}[{}]", std::process::id()));
        Client::connect_with(&self.url, options).await
    }

    /// Memory of the server in bytes: the proportional set size (PSS) of the
    /// server's process and all its descendants (PostgreSQL runs one process
    /// per connection; PSS counts their shared memory once), summed over every
    /// member of a replicated setup. `None` for a server this run did not
    /// start, for a twin, and for `memory://`, whose table shares this process
    /// with the bench's own clients.
    pub fn memory(&self) -> Option<u64> {
        if self.twin {
            return None;
        }
        let sizes: Vec<u64> = self
            .spawned
            .as_ref()?
            .processes()
            .iter()
            .filter_map(|p| tree_memory(p.pid()?))
            .collect();
        (!sizes.is_empty()).then(|| sizes.iter().sum())
    }

    /// The process of every server of this backend this run started (none
    /// for a backend it did not start, and for `memory://`, which runs in
    /// this process), for CPU figures ([`super::cpu`]).
    pub fn store_roots(&self) -> Vec<u32> {
        self.spawned.as_ref().map_or_else(Vec::new, |spawned| {
            spawned.processes().iter().filter_map(|p| p.pid()).collect()
        })
    }

    /// The server's version, when this run started it.
    pub fn version(&self) -> Option<String> {
        self.spawned.as_deref().and_then(Spawned::version)
    }
}

/// Masters of a Redlock setup.
const REDLOCK_MASTERS: usize = 5;

/// A server started by this run, or a replicated setup of them.
pub enum Spawned {
    /// `locksmith serve`, a child of this process.
    Serve(ServeProcess),
    /// `locksmith serve` processes forming one cluster.
    ServeCluster(ServeCluster),
    /// `redis-server`.
    Redis(Redis),
    /// A Redis primary with replicas and Sentinels.
    RedisSentinel(RedisSentinel),
    /// A Redis Cluster.
    RedisCluster(RedisCluster),
    /// Independent Redis masters for Redlock.
    Redlock(Vec<Redis>),
    /// ZooKeeper (a JVM).
    ZooKeeper(ZooKeeper),
    /// A ZooKeeper ensemble.
    ZooKeeperEnsemble(ZooKeeperEnsemble),
    /// `etcd`.
    Etcd(Etcd),
    /// An etcd cluster.
    EtcdCluster(EtcdCluster),
    /// PostgreSQL.
    Postgres(Postgres),
}

impl Spawned {
    /// The server of a single-server kind: kill, restart, pause.
    pub fn single(&self) -> Option<&dyn Server> {
        Some(match self {
            Spawned::Serve(s) => s,
            Spawned::Redis(s) => s,
            Spawned::ZooKeeper(s) => s,
            Spawned::Etcd(s) => s,
            Spawned::Postgres(s) => s,
            _ => return None,
        })
    }

    /// Every server of the setup: the one server, or every member.
    pub fn members(&self) -> Vec<&dyn Server> {
        fn all<S: Server>(members: &[S]) -> Vec<&dyn Server> {
            members.iter().map(|m| m as &dyn Server).collect()
        }
        match self {
            Spawned::RedisSentinel(s) => {
                let mut members = all(s.nodes());
                members.extend(all(s.sentinels()));
                members
            }
            Spawned::RedisCluster(c) => all(c.nodes()),
            Spawned::Redlock(masters) => all(masters),
            Spawned::ZooKeeperEnsemble(e) => all(e.servers()),
            Spawned::EtcdCluster(c) => all(c.members()),
            Spawned::ServeCluster(c) => c.members().into_iter().map(|m| m as &dyn Server).collect(),
            single => single.single().into_iter().collect(),
        }
    }

    /// The log of every server process the setup started: each member,
    /// and on the locksmith cluster also its spares and removed members.
    pub fn logs(&self) -> Vec<&Path> {
        match self {
            Spawned::ServeCluster(c) => c
                .every_server()
                .iter()
                .map(|s| s.process().log_path())
                .collect(),
            other => other
                .members()
                .into_iter()
                .map(|m| m.process().log_path())
                .collect(),
        }
    }

    /// The hosts of a replicated setup whose members run on hosts of their
    /// own. Outside the locksmith cluster, member `i` of
    /// [`Spawned::members`] runs on host `i`.
    pub fn network(&self) -> Option<&Network> {
        match self {
            Spawned::RedisSentinel(s) => s.network(),
            Spawned::RedisCluster(c) => c.network(),
            Spawned::ZooKeeperEnsemble(e) => e.network(),
            Spawned::EtcdCluster(c) => c.network(),
            Spawned::ServeCluster(c) => c.network(),
            _ => None,
        }
    }

    /// Waits until a replicated setup has every member back in place (after a
    /// fault); a single server has nothing to wait for.
    ///
    /// Blocking: it asks the servers, for up to a minute or two.
    pub fn wait_healthy(&self) -> Result<(), String> {
        match self {
            Spawned::RedisSentinel(s) => s.wait_healthy(),
            Spawned::RedisCluster(c) => c.wait_healthy(),
            Spawned::ZooKeeperEnsemble(e) => e.wait_healthy(),
            Spawned::EtcdCluster(c) => c.wait_healthy(),
            Spawned::ServeCluster(c) => c.wait_ready(),
            _ => Ok(()),
        }
        .map_err(|e| e.to_string())
    }

    /// The processes of every member, for memory figures.
    pub fn processes(&self) -> Vec<&Process> {
        self.members().into_iter().map(Server::process).collect()
    }

    /// The URL clients use.
    pub fn url(&self) -> String {
        match self {
            Spawned::RedisSentinel(s) => s.url(),
            Spawned::RedisCluster(c) => c.url(),
            Spawned::Redlock(masters) => format!(
                "redis+redlock://{}",
                masters
                    .iter()
                    .map(|m| format!("127.0.0.1:{}", m.port()))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            Spawned::ZooKeeperEnsemble(e) => e.url(),
            Spawned::EtcdCluster(c) => c.url(),
            Spawned::ServeCluster(c) => c.url(),
            single => single.single().expect("a single server").url(),
        }
    }

    /// The version the server reports (best effort).
    pub fn version(&self) -> Option<String> {
        let redis_version = |redis: &Redis| {
            let info = redis.query(&["INFO", "server"]).ok()?;
            let info = info.as_str()?.to_owned();
            info.lines()
                .find_map(|l| l.strip_prefix("redis_version:"))
                .map(|v| format!("Redis {}", v.trim()))
        };
        let zookeeper_version = |zk: &ZooKeeper| {
            let srvr = zk.four_letter("srvr").ok()?;
            srvr.lines()
                .find_map(|l| l.strip_prefix("Zookeeper version: "))
                .map(|v| format!("ZooKeeper {}", v.split(['-', ',']).next().unwrap_or(v)))
        };
        let etcd_version = |etcd: &Etcd| {
            let out = etcd.etcdctl().arg("version").output().ok()?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.lines()
                .find_map(|l| l.strip_prefix("etcdctl version: "))
                .map(|v| format!("etcd {}", v.trim()))
        };
        match self {
            Spawned::Serve(_) | Spawned::ServeCluster(_) => {
                Some(format!("locksmith {}", env!("CARGO_PKG_VERSION")))
            }
            Spawned::Redis(redis) => redis_version(redis),
            Spawned::RedisSentinel(s) => redis_version(&s.nodes()[0]),
            Spawned::RedisCluster(c) => redis_version(&c.nodes()[0]),
            Spawned::Redlock(masters) => redis_version(&masters[0]),
            Spawned::ZooKeeper(zk) => zookeeper_version(zk),
            Spawned::ZooKeeperEnsemble(e) => zookeeper_version(&e.servers()[0]),
            Spawned::Etcd(etcd) => etcd_version(etcd),
            Spawned::EtcdCluster(c) => etcd_version(&c.members()[0]),
            Spawned::Postgres(pg) => pg
                .query("show server_version")
                .ok()
                .map(|v| format!("PostgreSQL {}", v.split_whitespace().next().unwrap_or(&v))),
        }
    }
}

/// User + system time of `pid` so far, in clock ticks (/proc/PID/stat).
pub fn cpu_ticks(pid: u32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // Fields after the command name (in parentheses): utime and stime are
    // the 12th and 13th.
    let after = stat.rfind(')').map_or("", |at| &stat[at + 2..]);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    field(11) + field(12)
}

/// `ticks` of CPU time ([`cpu_ticks`]) over `over`, in % of one core. /proc
/// counts in `USER_HZ`, which Linux fixes at 100 for user space on every
/// architecture it reports it.
pub fn cpu_percent(ticks: u64, over: std::time::Duration) -> f64 {
    const TICKS_PER_SEC: f64 = 100.0;
    ticks as f64 / TICKS_PER_SEC / over.as_secs_f64().max(f64::MIN_POSITIVE) * 100.0
}

/// Sum of the PSS (or RSS where PSS is unavailable) of the process `root` and
/// its [`family`], in bytes.
pub fn tree_memory(root: u32) -> Option<u64> {
    let sizes: Vec<u64> = family(root)
        .into_iter()
        .filter_map(|pid| pss(pid).or_else(|| rss(pid)))
        .collect();
    (!sizes.is_empty()).then(|| sizes.iter().sum())
}

/// The process `root`, its descendants and the rest of its process group.
/// Descendants, because PostgreSQL puts every backend in a process group of
/// its own; the group, for a server started through a wrapper that has exited.
pub(super) fn family(root: u32) -> Vec<u32> {
    // (pid, parent, group) of every process.
    let processes: Vec<(u32, u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let (parent, group) = parent_and_group(pid)?;
            Some((pid, parent, group))
        })
        .collect();
    let mut members = vec![root];
    let mut i = 0;
    while i < members.len() {
        let parent = members[i];
        for &(pid, ppid, group) in &processes {
            if (ppid == parent || group == root) && !members.contains(&pid) {
                members.push(pid);
            }
        }
        i += 1;
    }
    members
}

/// The parent and the process group of `pid`, from /proc/PID/stat.
fn parent_and_group(pid: u32) -> Option<(u32, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces.
    let after = &stat[stat.rfind(')')? + 2..];
    // Fields after the name: state, ppid, pgrp.
    let mut fields = after.split_whitespace().skip(1);
    Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
}

fn kib_field(path: &str, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line[field.len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

fn pss(pid: u32) -> Option<u64> {
    kib_field(&format!("/proc/{pid}/smaps_rollup"), "Pss:")
}

fn rss(pid: u32) -> Option<u64> {
    kib_field(&format!("/proc/{pid}/status"), "VmRSS:")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_specs_take_an_optional_label() {
        let plain: BackendSpec = "redis://127.0.0.1:6379".parse().unwrap();
        assert_eq!(plain.label, "redis");
        let named: BackendSpec = "fast=locksmith://127.0.0.1:7420".parse().unwrap();
        assert_eq!(
            (named.label.as_str(), named.url.as_str()),
            ("fast", "locksmith://127.0.0.1:7420")
        );
        let pg: BackendSpec = "postgres://u:p@h/db?x=y".parse().unwrap();
        assert_eq!(pg.url, "postgres://u:p@h/db?x=y");
        assert!("ftp://x".parse::<BackendSpec>().is_err());
    }

    #[test]
    fn spawn_lists_parse() {
        assert_eq!(
            parse_kinds("redis, server,redis").unwrap(),
            vec![Kind::Server, Kind::Redis]
        );
        assert_eq!(parse_kinds("all").unwrap().len(), Kind::ALL.len());
        assert_eq!(
            parse_kinds("redis-cluster,redis,redis-sentinel").unwrap(),
            vec![Kind::Redis, Kind::RedisSentinel, Kind::RedisCluster]
        );
        assert_eq!(
            parse_kinds("zookeeper-cluster,zookeeper-ensemble,zk-cluster").unwrap(),
            vec![Kind::ZooKeeperEnsemble]
        );
        assert!(parse_kinds("mysql").is_err());
        assert_eq!(
            Kind::of_url("redis+sentinel://a,b/m"),
            Some(Kind::RedisSentinel)
        );
        assert_eq!(Kind::of_url("redis+redlock://a,b,c"), Some(Kind::Redlock));
    }

    #[test]
    fn memory_counts_the_whole_process_tree() {
        assert!(tree_memory(std::process::id()).unwrap() > 0);
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let family = family(std::process::id());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(family.contains(&child.id()), "{family:?}");
    }
}
