//! [`Redis`]: a real `redis-server`.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tempfile::TempDir;

use crate::certs::Certificates;
use crate::netns::{self, Host};
use crate::process::Process;
use crate::{
    free_port, impl_server, resp, retry_on_port_clash, server_dir, try_binary, RespValue, Result,
};

/// How long a Redis gets to answer `PING` (and, for a replica, to sync).
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// The timeout of each read and write of [`Redis::query`].
const QUERY_TIMEOUT: Duration = Duration::from_secs(5);
/// The Unix socket in the server's directory that the testkit's own
/// commands go through.
const SOCKET: &str = "redis.sock";

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
    /// Where it listens: loopback, or its host's address.
    ip: Ipv4Addr,
    port: u16,
    dir: TempDir,
    primary_port: Option<u16>,
    role: Role,
    /// The certificates, where its port speaks only TLS.
    tls: Option<Arc<RedisTls>>,
}

/// How [`Redis::launch_as`] starts a server.
#[derive(Clone, Copy)]
pub(crate) struct Launch<'a> {
    pub role: Role,
    /// The primary a replica starts replicating.
    pub primary: Option<SocketAddr>,
    /// More configuration lines.
    pub extra: &'a [String],
    /// Put the port on TLS only, with these certificates.
    pub tls: Option<&'a Arc<RedisTls>>,
    /// Run on this host instead of loopback.
    pub host: Option<&'a Host>,
}

impl Launch<'_> {
    /// A server in `role` on loopback, plaintext, with no more configuration.
    pub(crate) fn new(role: Role) -> Self {
        Launch {
            role,
            primary: None,
            extra: &[],
            tls: None,
            host: None,
        }
    }
}

/// The certificates of a Redis, or of every server of a setup, whose ports
/// speak only TLS: a CA, a server certificate for `127.0.0.1` and
/// `localhost`, and a client certificate that every node shows where it is a
/// client itself (a replica to its primary, a Sentinel to the nodes and the
/// other Sentinels, a cluster node on the cluster bus), because every port
/// requires one.
#[derive(Debug)]
pub(crate) struct RedisTls {
    certificates: Certificates,
    node_cert: (PathBuf, PathBuf),
    // Declared last: the files go after the nodes that read them.
    _dir: TempDir,
}

impl RedisTls {
    /// Makes the certificates in a directory of their own (needs `openssl`).
    pub(crate) fn make() -> Result<Arc<RedisTls>> {
        let dir = server_dir("redis-tls")?;
        let certificates = Certificates::make(
            &dir.path().join("tls"),
            &["DNS:localhost", &format!("IP:{}", crate::HOST)],
            None,
        )?;
        let node_cert = certificates.client("redis-node")?;
        Ok(Arc::new(RedisTls {
            certificates,
            node_cert,
            _dir: dir,
        }))
    }

    /// The CA, for clients to check the nodes with and make certificates.
    pub(crate) fn certificates(&self) -> &Certificates {
        &self.certificates
    }

    /// The configuration lines that put a node's port on TLS only, with
    /// client certificates required, and make it use TLS as a client too.
    fn config(&self, port: u16) -> Vec<String> {
        let (cert, key) = &self.node_cert;
        vec![
            "port 0".to_owned(),
            format!("tls-port {port}"),
            format!(
                "tls-cert-file {}",
                self.certificates.server_cert().display()
            ),
            format!("tls-key-file {}", self.certificates.server_key().display()),
            format!("tls-ca-cert-file {}", self.certificates.ca_cert().display()),
            format!("tls-client-cert-file {}", cert.display()),
            format!("tls-client-key-file {}", key.display()),
            "tls-auth-clients yes".to_owned(),
            "tls-replication yes".to_owned(),
        ]
    }

    /// The `redis-cli` arguments that connect with TLS and the node
    /// certificate.
    pub(crate) fn cli_args(&self) -> Vec<std::ffi::OsString> {
        vec![
            "--tls".into(),
            "--cacert".into(),
            self.certificates.ca_cert().into(),
            "--cert".into(),
            self.node_cert.0.clone().into(),
            "--key".into(),
            self.node_cert.1.clone().into(),
        ]
    }

    /// The query of a client URL that trusts the CA (`tls_ca=…`).
    pub(crate) fn url_query(&self) -> String {
        format!("?tls_ca={}", self.certificates.ca_cert().display())
    }
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

    /// Like [`Redis::start`], its port speaking only TLS with a certificate
    /// for `127.0.0.1` signed by a CA made for it ([`Redis::certificates`]),
    /// and letting in only clients with a certificate of that CA. Needs
    /// `openssl`.
    #[track_caller]
    pub fn start_tls() -> Redis {
        crate::or_panic(Self::try_start_tls())
    }

    /// Like [`Redis::start_tls`], returning the error instead of panicking.
    pub fn try_start_tls() -> Result<Redis> {
        let tls = RedisTls::make()?;
        retry_on_port_clash(|| {
            Self::launch_as(Launch {
                tls: Some(&tls),
                ..Launch::new(Role::Standalone)
            })
        })
    }

    /// The CA of a Redis started with [`Redis::start_tls`] (or a member of
    /// a TLS setup), which makes client certificates
    /// ([`Certificates::client`]); `None` without TLS.
    pub fn certificates(&self) -> Option<&Certificates> {
        self.tls.as_deref().map(RedisTls::certificates)
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
        Self::launch_as(Launch {
            primary: primary_port.map(crate::loopback),
            ..Launch::new(role)
        })
    }

    /// Starts a `redis-server` as `launch` says, from a `redis.conf` in its
    /// own directory (so `CONFIG REWRITE`, which Sentinel and Cluster rely on,
    /// keeps a changed role across restarts), and waits until it is ready for
    /// its role.
    pub(crate) fn launch_as(launch: Launch<'_>) -> Result<Redis> {
        let Launch {
            role,
            primary,
            extra,
            tls,
            host,
        } = launch;
        let program = try_binary("redis-server", "redis-server")?;
        let port = free_port();
        let dir = server_dir("redis")?;
        let ip = netns::address(host);
        let name = match (role, primary) {
            (Role::Sentinel, _) => format!("redis-sentinel on {ip}:{port}"),
            (_, Some(p)) => format!("redis-server replica of {p} on {ip}:{port}"),
            (_, None) => format!("redis-server on {ip}:{port}"),
        };
        let mut config = match tls {
            None => vec![format!("port {port}")],
            Some(tls) => tls.config(port),
        };
        if tls.is_some() && role != Role::Sentinel {
            // A replica tells its primary the port to reach it at, which the
            // Sentinels then use: the TLS one.
            config.push(format!("replica-announce-port {port}"));
        }
        config.extend([
            format!("bind {ip}"),
            format!("dir {}", dir.path().display()),
            format!("unixsocket {}", dir.path().join(SOCKET).display()),
            "unixsocketperm 700".to_owned(),
            "daemonize no".to_owned(),
            "protected-mode no".to_owned(),
            "logfile \"\"".to_owned(),
        ]);
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
        if let Some(p) = primary {
            config.push(format!("replicaof {} {}", p.ip(), p.port()));
        }
        config.extend(extra.iter().cloned());
        let file = dir.path().join(match role {
            Role::Sentinel => "sentinel.conf",
            _ => "redis.conf",
        });
        std::fs::write(&file, config.join("\n") + "\n")
            .map_err(|e| crate::Error::io(format!("cannot write {}", file.display()), e))?;
        let mut spec = netns::spec(host, name, program, dir.path().join("redis.log"))
            .current_dir(dir.path())
            .arg(&file);
        if role == Role::Sentinel {
            spec = spec.arg("--sentinel");
        }
        let redis = Redis {
            process: Process::spawn(spec)?,
            ip,
            port,
            dir,
            primary_port: primary.map(|p| p.port()),
            role,
            tls: tls.cloned(),
        };
        redis.wait_ready()?;
        Ok(redis)
    }

    fn wait_ready(&self) -> Result<()> {
        self.process.wait_ready(READY_TIMEOUT, || {
            match self.probe(&["PING"], Duration::from_millis(500)) {
                Ok(RespValue::Simple(pong)) if pong == "PONG" => {}
                Ok(other) => return Err(format!("PING answered {other:?}")),
                Err(e) => return Err(format!("PING failed: {e}")),
            }
            if self.role == Role::Replica {
                let info = self
                    .probe(&["INFO", "replication"], Duration::from_millis(500))
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

    /// `redis://127.0.0.1:<port>`, or where the port speaks TLS
    /// `rediss://127.0.0.1:<port>?tls_ca=<CA file>`, without a client
    /// certificate ([`Redis::certificates`] makes one).
    pub fn url(&self) -> String {
        match &self.tls {
            None => format!("redis://{}", self.address()),
            Some(tls) => format!("rediss://{}{}", self.address(), tls.url_query()),
        }
    }

    /// Where clients reach it: `127.0.0.1`, or its host's address for a
    /// member of a setup on hosts of their own.
    pub fn address(&self) -> SocketAddr {
        SocketAddr::from((self.ip, self.port))
    }

    /// The port of the primary, if this is a replica.
    pub fn primary_port(&self) -> Option<u16> {
        self.primary_port
    }

    /// Sends one command on a fresh connection and returns the reply, like
    /// `redis.query(&["SET", "k", "v"])`. Each read and write gives up after 5 s
    /// (so a paused server yields an error, not a hang). It goes through the
    /// server's Unix socket, so it works also where the port speaks TLS only.
    pub fn query(&self, args: &[&str]) -> io::Result<RespValue> {
        self.probe(args, QUERY_TIMEOUT)
    }

    /// One command through the Unix socket, giving up after `timeout`.
    pub(crate) fn probe(&self, args: &[&str], timeout: Duration) -> io::Result<RespValue> {
        resp::query(&self.dir.path().join(SOCKET), args, timeout)
    }
}

impl_server!(Redis, "redis");
