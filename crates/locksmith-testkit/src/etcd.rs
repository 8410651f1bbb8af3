//! [`Etcd`]: a real single-member `etcd`.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use tempfile::TempDir;

use crate::process::{Process, ProcessSpec};
use crate::{binary, free_port, impl_server, retry_on_port_clash, server_dir, try_binary, Result};

/// How long etcd gets to report itself healthy (it must elect itself leader).
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A single-member `etcd` cluster on `127.0.0.1` (client and peer port), in its
/// own temporary directory, killed on drop.
///
/// ```no_run
/// use locksmith_testkit::Etcd;
///
/// let etcd = Etcd::start();
/// let out = etcd.etcdctl().args(["put", "k", "v"]).output().unwrap();
/// assert!(out.status.success());
/// ```
#[derive(Debug)]
pub struct Etcd {
    // Declared first so it is dropped (killed) before the directory is removed.
    process: Process,
    port: u16,
    peer_port: u16,
    dir: TempDir,
}

impl Etcd {
    /// Starts etcd on free ports and waits until `GET /health` reports it healthy;
    /// panics on failure (for example when `etcd` is not installed).
    #[track_caller]
    pub fn start() -> Etcd {
        crate::or_panic(Self::try_start())
    }

    /// Like [`Etcd::start`], returning the error instead of panicking.
    pub fn try_start() -> Result<Etcd> {
        retry_on_port_clash(Self::launch)
    }

    fn launch() -> Result<Etcd> {
        let (port, peer_port) = (free_port(), free_port());
        let peer_url = format!("http://{}:{peer_port}", crate::HOST);
        let etcd = Self::spawn_member("default", port, peer_port, &format!("default={peer_url}"))?;
        etcd.wait_ready()?;
        Ok(etcd)
    }

    /// Starts member `name` of a new cluster whose members and peer URLs are
    /// `initial_cluster` (`name=http://…,…`), without waiting: a member of a
    /// new cluster becomes healthy only once a majority of them runs.
    pub(crate) fn spawn_member(
        name: &str,
        port: u16,
        peer_port: u16,
        initial_cluster: &str,
    ) -> Result<Etcd> {
        let program = try_binary("etcd", "etcd-server")?;
        let dir = server_dir("etcd")?;
        let client_url = format!("http://{}:{port}", crate::HOST);
        let peer_url = format!("http://{}:{peer_port}", crate::HOST);
        let spec = ProcessSpec::new(
            format!("etcd {name} on port {port}"),
            program,
            dir.path().join("etcd.log"),
        )
        .current_dir(dir.path())
        .args(["--name", name])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["--listen-client-urls", &client_url])
        .args(["--advertise-client-urls", &client_url])
        .args(["--listen-peer-urls", &peer_url])
        .args(["--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", initial_cluster])
        .args(["--initial-cluster-state", "new"])
        .args(["--logger", "zap", "--log-outputs", "stderr"]);
        Ok(Etcd {
            process: Process::spawn(spec)?,
            port,
            peer_port,
            dir,
        })
    }

    pub(crate) fn wait_ready(&self) -> Result<()> {
        self.process.wait_ready(READY_TIMEOUT, || {
            let answer = health(self.port, Duration::from_millis(500))
                .map_err(|e| format!("GET /health failed: {e}"))?;
            if answer.contains(r#""health":"true""#) {
                Ok(())
            } else {
                Err(format!(
                    "GET /health answered {:?}",
                    answer.lines().last().unwrap_or_default()
                ))
            }
        })
    }

    /// Stops etcd if it runs (`SIGTERM`, then `SIGKILL`) and starts it again on
    /// the same ports with the same data directory, waiting until it is healthy.
    pub fn try_restart(&self) -> Result<()> {
        self.process.stop();
        self.process.start()?;
        self.wait_ready()
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The peer (raft) port.
    pub fn peer_port(&self) -> u16 {
        self.peer_port
    }

    /// `http://127.0.0.1:<port>`, the endpoint etcd clients take.
    pub fn endpoint(&self) -> String {
        format!("http://{}:{}", crate::HOST, self.port)
    }

    /// `etcd://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("etcd://{}:{}", crate::HOST, self.port)
    }

    /// An `etcdctl` command talking to this etcd (`ETCDCTL_API=3`,
    /// `--endpoints`); add the subcommand, like `.args(["get", "k"])`. Panics if
    /// `etcdctl` is not installed (Debian package `etcd-client`).
    #[track_caller]
    pub fn etcdctl(&self) -> Command {
        let mut command = Command::new(binary("etcdctl", "etcd-client"));
        command
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoint()))
            .arg("--dial-timeout=5s");
        command
    }

    /// Whether `GET /health` answers healthy right now.
    pub fn is_healthy(&self) -> bool {
        health(self.port, Duration::from_secs(2))
            .map(|answer| answer.contains(r#""health":"true""#))
            .unwrap_or(false)
    }
}

impl_server!(Etcd, "etcd");

/// `GET /health` over a raw TCP connection; returns the whole HTTP response.
fn health(port: u16, timeout: Duration) -> io::Result<String> {
    http(port, "GET", "/health", "", timeout)
}

/// One HTTP/1.1 request over a raw TCP connection; returns the whole response.
pub(crate) fn http(
    port: u16,
    method: &str,
    path: &str,
    body: &str,
    timeout: Duration,
) -> io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&crate::loopback(port), timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {}:{port}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        crate::HOST,
        body.len()
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}
