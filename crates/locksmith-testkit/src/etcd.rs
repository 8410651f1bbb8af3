//! [`Etcd`]: a real single-member `etcd`.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use tempfile::TempDir;

use crate::certs::Certificates;
use crate::netns::{self, Host};
use crate::process::{self, Process};
use crate::{free_port, impl_server, retry_on_port_clash, server_dir, try_binary, Result};

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
///
/// [`Etcd::start_tls`] starts one that clients reach only over TLS with a
/// client certificate, [`Etcd::start_auth`] one with authentication on.
#[derive(Debug)]
pub struct Etcd {
    // Declared first so it is dropped (killed) before the directory is removed.
    process: Process,
    /// Where it listens: loopback, or its host's address.
    ip: Ipv4Addr,
    port: u16,
    peer_port: u16,
    /// Serves `GET /health` over plain HTTP, also when clients need TLS.
    metrics_port: u16,
    /// The CA, server and client certificates of a TLS-only etcd.
    certificates: Option<Certificates>,
    /// Whether authentication is on (user `root`, [`Etcd::ROOT_PASSWORD`]).
    auth: bool,
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
        retry_on_port_clash(|| Self::launch(false, &[]))
    }

    /// Like [`Etcd::start`], speaking TLS only: its certificate (for
    /// `localhost` and `127.0.0.1`) is signed by a CA made for it
    /// ([`Etcd::ca_cert`]), and it lets in only clients with a certificate
    /// of that CA ([`Etcd::client_cert`]). Needs `openssl`.
    #[track_caller]
    pub fn start_tls() -> Etcd {
        crate::or_panic(Self::try_start_tls())
    }

    /// Like [`Etcd::start_tls`], returning the error instead of panicking.
    pub fn try_start_tls() -> Result<Etcd> {
        retry_on_port_clash(|| Self::launch(true, &[]))
    }

    /// The password of user `root` on an etcd started with
    /// [`Etcd::start_auth`].
    pub const ROOT_PASSWORD: &'static str = "s3cret-root";

    /// Like [`Etcd::start`], with authentication on: user `root` (role
    /// `root`), password [`Etcd::ROOT_PASSWORD`]. Tokens expire after one
    /// second unused (`--auth-token-ttl=1`), so a client that idles longer
    /// must log in again. Needs `etcdctl`.
    #[track_caller]
    pub fn start_auth() -> Etcd {
        crate::or_panic(Self::try_start_auth())
    }

    /// Like [`Etcd::start_auth`], returning the error instead of panicking.
    pub fn try_start_auth() -> Result<Etcd> {
        let mut etcd = retry_on_port_clash(|| Self::launch(false, &["--auth-token-ttl=1"]))?;
        let user = format!("root:{}", Self::ROOT_PASSWORD);
        for args in [
            &["user", "add", &user][..],
            &["user", "grant-role", "root", "root"],
            &["auth", "enable"],
        ] {
            process::run(etcd.etcdctl_command()?.args(args), None)?;
        }
        etcd.auth = true;
        Ok(etcd)
    }

    fn launch(tls: bool, extra_args: &[&str]) -> Result<Etcd> {
        let (port, peer_port) = (free_port(), free_port());
        let peer_url = format!("http://{}:{peer_port}", crate::HOST);
        let initial = format!("default={peer_url}");
        let etcd = Self::spawn("default", None, port, peer_port, &initial, tls, extra_args)?;
        etcd.wait_ready()?;
        Ok(etcd)
    }

    /// Starts member `name` of a new cluster whose members and peer URLs are
    /// `initial_cluster` (`name=http://…,…`), on `host` (loopback for
    /// `None`), without waiting: a member of a new cluster becomes healthy
    /// only once a majority of them runs.
    pub(crate) fn spawn_member(
        name: &str,
        host: Option<&Host>,
        port: u16,
        peer_port: u16,
        initial_cluster: &str,
    ) -> Result<Etcd> {
        Self::spawn(name, host, port, peer_port, initial_cluster, false, &[])
    }

    fn spawn(
        name: &str,
        host: Option<&Host>,
        port: u16,
        peer_port: u16,
        initial_cluster: &str,
        tls: bool,
        extra_args: &[&str],
    ) -> Result<Etcd> {
        let program = try_binary("etcd", "etcd-server")?;
        let dir = server_dir("etcd")?;
        let ip = netns::address(host);
        let scheme = if tls { "https" } else { "http" };
        let client_url = format!("{scheme}://{ip}:{port}");
        let peer_url = format!("http://{ip}:{peer_port}");
        let metrics_port = free_port();
        let metrics_url = format!("http://{ip}:{metrics_port}");
        let mut spec = netns::spec(
            host,
            format!("etcd {name} on {ip}:{port}"),
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
        .args(["--listen-metrics-urls", &metrics_url])
        .args(["--logger", "zap", "--log-outputs", "stderr"])
        .args(extra_args);
        let certificates = if tls {
            let certificates = Certificates::make(
                &dir.path().join("tls"),
                &["DNS:localhost", "IP:127.0.0.1"],
                None,
            )?;
            spec = spec
                .arg("--cert-file")
                .arg(certificates.server_cert())
                .arg("--key-file")
                .arg(certificates.server_key())
                .arg("--trusted-ca-file")
                .arg(certificates.ca_cert())
                .arg("--client-cert-auth");
            Some(certificates)
        } else {
            None
        };
        Ok(Etcd {
            process: Process::spawn(spec)?,
            ip,
            port,
            peer_port,
            metrics_port,
            certificates,
            auth: false,
            dir,
        })
    }

    pub(crate) fn wait_ready(&self) -> Result<()> {
        self.process.wait_ready(READY_TIMEOUT, || {
            let answer = health(self.metrics_address(), Duration::from_millis(500))
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

    /// The address it listens on: `127.0.0.1`, or its host's for a member of
    /// a cluster on hosts of their own.
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// The client address, for probes.
    pub(crate) fn address(&self) -> SocketAddr {
        SocketAddr::from((self.ip, self.port))
    }

    fn metrics_address(&self) -> SocketAddr {
        SocketAddr::from((self.ip, self.metrics_port))
    }

    /// The peer (raft) port.
    pub fn peer_port(&self) -> u16 {
        self.peer_port
    }

    /// `http://127.0.0.1:<port>` (`https://` for [`Etcd::start_tls`]), the
    /// endpoint etcd clients take.
    pub fn endpoint(&self) -> String {
        let scheme = if self.certificates.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}:{}", self.ip, self.port)
    }

    /// `etcd://127.0.0.1:<port>`, or for [`Etcd::start_tls`]
    /// `etcds://127.0.0.1:<port>?ca=<CA file>` (without a client
    /// certificate, which [`Etcd::client_cert`] makes).
    pub fn url(&self) -> String {
        match &self.certificates {
            None => format!("etcd://{}:{}", self.ip, self.port),
            Some(certificates) => format!(
                "etcds://{}:{}?ca={}",
                self.ip,
                self.port,
                certificates.ca_cert().display()
            ),
        }
    }

    /// The CA certificate (PEM) of an etcd started with [`Etcd::start_tls`].
    pub fn ca_cert(&self) -> Option<PathBuf> {
        self.certificates.as_ref().map(Certificates::ca_cert)
    }

    /// A client certificate and key (PEM files) for `common_name`, signed by
    /// the CA of an etcd started with [`Etcd::start_tls`]; `None` for one
    /// without TLS.
    pub fn client_cert(&self, common_name: &str) -> Option<Result<(PathBuf, PathBuf)>> {
        self.certificates
            .as_ref()
            .map(|certificates| certificates.client(common_name))
    }

    /// An `etcdctl` command talking to this etcd (`ETCDCTL_API=3`,
    /// `--endpoints`, and the CA and a client certificate for TLS, user
    /// `root` when authentication is on); add the subcommand, like
    /// `.args(["get", "k"])`. Panics if `etcdctl` is not installed (Debian
    /// package `etcd-client`).
    #[track_caller]
    pub fn etcdctl(&self) -> Command {
        let mut command = crate::or_panic(self.etcdctl_command());
        if self.auth {
            command.arg(format!("--user=root:{}", Self::ROOT_PASSWORD));
        }
        command
    }

    fn etcdctl_command(&self) -> Result<Command> {
        let mut command = Command::new(try_binary("etcdctl", "etcd-client")?);
        command
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoint()))
            .arg("--dial-timeout=5s");
        if let Some(certificates) = &self.certificates {
            let (cert, key) = certificates.client("etcdctl")?;
            command
                .arg("--cacert")
                .arg(certificates.ca_cert())
                .arg("--cert")
                .arg(cert)
                .arg("--key")
                .arg(key);
        }
        Ok(command)
    }

    /// Whether `GET /health` answers healthy right now.
    pub fn is_healthy(&self) -> bool {
        health(self.metrics_address(), Duration::from_secs(2))
            .map(|answer| answer.contains(r#""health":"true""#))
            .unwrap_or(false)
    }
}

impl_server!(Etcd, "etcd");

/// `GET /health` over a raw TCP connection; returns the whole HTTP response.
fn health(address: SocketAddr, timeout: Duration) -> io::Result<String> {
    http(address, "GET", "/health", "", timeout)
}

/// One HTTP/1.1 request over a raw TCP connection; returns the whole response.
pub(crate) fn http(
    address: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    timeout: Duration,
) -> io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&address, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        address,
        body.len()
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}
