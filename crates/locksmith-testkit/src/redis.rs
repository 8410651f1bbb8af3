//! [`Redis`]: a real `redis-server`.

use std::io;
use std::time::Duration;

use tempfile::TempDir;

use crate::process::{Process, ProcessSpec};
use crate::{
    free_port, impl_server, resp, retry_on_port_clash, server_dir, try_binary, RespValue, Result,
};

/// How long a Redis gets to answer `PING` (and, for a replica, to sync).
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// The timeout of each read and write of [`Redis::query`].
const QUERY_TIMEOUT: Duration = Duration::from_secs(5);

/// A `redis-server` on `127.0.0.1`, in its own temporary directory, killed on drop.
///
/// It runs with `appendonly yes` and `appendfsync always`, so every acknowledged
/// write survives [`kill`](Redis::kill) + [`restart`](Redis::restart), and with
/// `repl-diskless-sync-delay 0`, so replicas sync at once.
///
/// ```no_run
/// use locksmith_testkit::Redis;
///
/// let primary = Redis::start();
/// let replica = Redis::start_replica_of(&primary);
/// primary.query(&["SET", "k", "v"]).unwrap();
/// primary.pause(); // SIGSTOP: the primary hangs, the replica still answers
/// # let _ = replica;
/// ```
#[derive(Debug)]
pub struct Redis {
    // Declared first so it is dropped (killed) before the directory is removed.
    process: Process,
    port: u16,
    dir: TempDir,
    primary_port: Option<u16>,
    role: Role,
}

/// What a `redis-server` process is for, which decides its configuration and
/// when it counts as ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// A primary on its own: ready when it answers `PING`.
    Standalone,
    /// A replica: ready when it is in sync with its primary.
    Replica,
    /// A member of a Sentinel or Cluster setup, whose role may change: ready
    /// when it answers `PING`; the setup waits for the rest.
    Member,
    /// A Sentinel (`redis-server sentinel.conf --sentinel`): ready when it
    /// answers `PING`.
    Sentinel,
}

impl Redis {
    /// Starts a Redis on a free port and waits until it answers `PING`; panics on
    /// failure (for example when `redis-server` is not installed).
    #[track_caller]
    pub fn start() -> Redis {
        crate::or_panic(Self::try_start())
    }

    /// Like [`Redis::start`], returning the error instead of panicking.
    pub fn try_start() -> Result<Redis> {
        retry_on_port_clash(|| Self::launch(None))
    }

    /// Starts a Redis replicating `primary` (`replicaof 127.0.0.1 <port>`) and
    /// waits until its `INFO replication` shows `master_link_status:up`; panics
    /// on failure.
    #[track_caller]
    pub fn start_replica_of(primary: &Redis) -> Redis {
        crate::or_panic(Self::try_start_replica_of(primary))
    }

    /// Like [`Redis::start_replica_of`], returning the error instead of panicking.
    pub fn try_start_replica_of(primary: &Redis) -> Result<Redis> {
        retry_on_port_clash(|| Self::launch(Some(primary.port)))
    }

    fn launch(primary_port: Option<u16>) -> Result<Redis> {
        let role = match primary_port {
            Some(_) => Role::Replica,
            None => Role::Standalone,
        };
        Self::launch_as(role, primary_port, &[])
    }

    /// Starts a `redis-server` in the given role from a `redis.conf` in its own
    /// directory (so `CONFIG REWRITE`, which Sentinel and Cluster rely on, keeps
    /// a changed role across restarts), with `extra` configuration lines, and
    /// waits until it is ready for that role.
    pub(crate) fn launch_as(
        role: Role,
        primary_port: Option<u16>,
        extra: &[String],
    ) -> Result<Redis> {
        let program = try_binary("redis-server", "redis-server")?;
        let port = free_port();
        let dir = server_dir("redis")?;
        let name = match (role, primary_port) {
            (Role::Sentinel, _) => format!("redis-sentinel on port {port}"),
            (_, Some(p)) => format!("redis-server replica of {p} on port {port}"),
            (_, None) => format!("redis-server on port {port}"),
        };
        let mut config = vec![
            format!("port {port}"),
            format!("bind {}", crate::HOST),
            format!("dir {}", dir.path().display()),
            "daemonize no".to_owned(),
            "protected-mode no".to_owned(),
            "logfile \"\"".to_owned(),
        ];
        if role != Role::Sentinel {
            config.extend(
                [
                    "save \"\"",
                    "appendonly yes",
                    "appendfsync always",
                    "repl-diskless-sync-delay 0",
                ]
                .map(str::to_owned),
            );
        }
        if let Some(p) = primary_port {
            config.push(format!("replicaof {} {p}", crate::HOST));
        }
        config.extend(extra.iter().cloned());
        let file = dir.path().join(match role {
            Role::Sentinel => "sentinel.conf",
            _ => "redis.conf",
        });
        std::fs::write(&file, config.join("\n") + "\n")
            .map_err(|e| crate::Error::io(format!("cannot write {}", file.display()), e))?;
        let mut spec = ProcessSpec::new(name, program, dir.path().join("redis.log"))
            .current_dir(dir.path())
            .arg(&file);
        if role == Role::Sentinel {
            spec = spec.arg("--sentinel");
        }
        let redis = Redis {
            process: Process::spawn(spec)?,
            port,
            dir,
            primary_port,
            role,
        };
        redis.wait_ready()?;
        Ok(redis)
    }

    fn wait_ready(&self) -> Result<()> {
        self.process.wait_ready(READY_TIMEOUT, || {
            match resp::query(self.port, &["PING"], Duration::from_millis(500)) {
                Ok(RespValue::Simple(pong)) if pong == "PONG" => {}
                Ok(other) => return Err(format!("PING answered {other:?}")),
                Err(e) => return Err(format!("PING failed: {e}")),
            }
            if self.role == Role::Replica {
                let info = resp::query(
                    self.port,
                    &["INFO", "replication"],
                    Duration::from_millis(500),
                )
                .map_err(|e| format!("INFO replication failed: {e}"))?;
                let info = info.as_str().unwrap_or_default();
                if !info.contains("master_link_status:up") {
                    return Err("replica not in sync yet (master_link_status is not up)".into());
                }
            }
            Ok(())
        })
    }

    /// Stops Redis if it runs (`SIGTERM`, then `SIGKILL`) and starts it again on
    /// the same port and directory, waiting until it answers `PING` (and, for a
    /// replica, until it is in sync).
    pub fn try_restart(&self) -> Result<()> {
        self.process.stop();
        self.process.start()?;
        self.wait_ready()
    }

    /// The port Redis listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://{}:{}", crate::HOST, self.port)
    }

    /// The port of the primary, if this is a replica.
    pub fn primary_port(&self) -> Option<u16> {
        self.primary_port
    }

    /// Sends one command on a fresh connection and returns the reply, like
    /// `redis.query(&["SET", "k", "v"])`. Each read and write gives up after 5 s
    /// (so a paused server yields an error, not a hang).
    pub fn query(&self, args: &[&str]) -> io::Result<RespValue> {
        resp::query(self.port, args, QUERY_TIMEOUT)
    }
}

impl_server!(Redis, "redis");
