//! `locksmith serve` (the `locksmith` executable, see
//! [`crate::server_executable`]), alone or as a cluster, for the bench and
//! the torture.
//!
//! A cluster's members run on loopback, or each on a host of its own (a
//! network namespace, [`locksmith_testkit::netns`]) when a fault must cut the
//! network between members while clients on this machine still reach them
//! all. A cluster can also hold spare members, prepared but not started, that
//! a membership change brings in: their addresses are in the clients' URL
//! from the start, so that clients find the cluster whichever members it has.
//!
//! A cluster can also run secured ([`Placement::secured`]): TLS on every
//! member, members certified by a CA made for the run (`--tls-peer-ca`), and
//! authentication on, its clients holding a token with every permission.

use std::ffi::OsString;
use std::net::{Ipv4Addr, TcpStream};
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use locksmith::server::ServerUrl;
use locksmith_testkit::netns::{Host, Network};
use locksmith_testkit::{Certificates, Process, ProcessSpec, Server};

/// The locksmith server, run as `locksmith serve` with its data in a
/// temporary directory; killed with this process.
pub struct ServeProcess {
    // Declared first: killed before the directory is removed.
    process: Process,
    ip: Ipv4Addr,
    port: u16,
    /// Its node id in a cluster (1 for a lone server).
    id: u64,
    /// How clients reach it: `""`, or the TLS and token options of a
    /// secured cluster (`?ca=…&token_file=…`).
    client_options: String,
    /// Its data directory (`data`) and log, removed when it drops.
    dir: tempfile::TempDir,
}

impl ServeProcess {
    /// Starts `locksmith serve` on loopback and waits until it accepts
    /// connections.
    pub fn start() -> Result<ServeProcess, String> {
        let serve = ServeProcess::prepare(None, locksmith_testkit::free_port(), 1, &[], None)?;
        serve.launch()?;
        Ok(serve)
    }

    /// A server on `host` (loopback when `None`), not started yet.
    fn prepare(
        host: Option<&Host>,
        port: u16,
        id: u64,
        extra: &[&str],
        security: Option<&Security>,
    ) -> Result<ServeProcess, String> {
        let exe = crate::server_executable::path()?;
        let dir = tempfile::Builder::new()
            .prefix("locksmith-serve-")
            .tempdir()
            .map_err(|e| format!("cannot create a directory for the server: {e}"))?;
        let data = dir.path().join("data");
        // Owner-only, as the server makes it: a wider mode gets a warning.
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&data)
            .map_err(|e| format!("cannot create {}: {e}", data.display()))?;
        let ip = host.map_or(Ipv4Addr::LOCALHOST, |h| h.ip);
        let name = format!("locksmith serve on {ip}:{port}");
        let log = dir.path().join("serve.log");
        let spec = match host {
            None => ProcessSpec::new(name, exe, log),
            Some(host) => {
                let (program, prefix) = host.command();
                ProcessSpec::new(name, program, log).args(prefix).arg(exe)
            }
        }
        .args(serve_args(ip, port, &data))
        .args(extra)
        .args(crate::server_executable::serve_args())
        .args(security.map(Security::serve_args).unwrap_or_default())
        // Warnings only, unless the run asks for more (a torture that
        // should show how the members elected).
        .env(
            "RUST_LOG",
            std::env::var("LOCKSMITH_SERVE_LOG").unwrap_or_else(|_| "warn".into()),
        );
        Ok(ServeProcess {
            process: Process::prepare(spec),
            ip,
            port,
            id,
            client_options: security.map(Security::client_options).unwrap_or_default(),
            dir,
        })
    }

    /// Starts the prepared process and waits until it accepts connections.
    fn launch(&self) -> Result<(), String> {
        self.process.start().map_err(|e| e.to_string())?;
        self.wait_ready().map_err(|e| e.to_string())
    }

    /// Its data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// `host:port`, where clients and the other members reach it.
    pub fn address(&self) -> String {
        format!("{}:{}", self.ip, self.port)
    }

    /// Its node id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Whether this member serves clients, as only a cluster's leader does
    /// (blocking: asks it, for up to a second).
    pub fn leads(&self) -> bool {
        use locksmith_proto::v1::locksmith_client::LocksmithClient;
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return false;
        };
        let Ok(url) = ServerUrl::parse(&self.url()) else {
            return false;
        };
        runtime.block_on(async {
            let ask = async {
                let channel = url.endpoint(&self.address()).ok()?.connect().await.ok()?;
                let mut client = LocksmithClient::with_interceptor(channel, url.credentials());
                let request = locksmith_proto::v1::DescribeRequest {
                    name: "leader-probe".into(),
                };
                client.describe(request).await.ok()
            };
            matches!(
                tokio::time::timeout(Duration::from_secs(1), ask).await,
                Ok(Some(_))
            )
        })
    }

    fn wait_ready(&self) -> locksmith_testkit::Result<()> {
        let addr = std::net::SocketAddr::from((self.ip, self.port));
        self.process.wait_ready(Duration::from_secs(30), || {
            TcpStream::connect_timeout(&addr, Duration::from_millis(300))
                .map(drop)
                .map_err(|e| format!("connect failed: {e}"))
        })
    }
}

impl Server for ServeProcess {
    fn name(&self) -> &'static str {
        "server"
    }

    fn port(&self) -> u16 {
        self.port
    }

    fn url(&self) -> String {
        client_url(&[self.address()], &self.client_options)
    }

    fn process(&self) -> &Process {
        &self.process
    }

    fn try_restart(&self) -> locksmith_testkit::Result<()> {
        self.process.stop();
        self.process.start()?;
        self.wait_ready()
    }
}

/// How `locksmith serve` is told where to listen and where to keep its log.
/// Kept in one place so that a change of `serve`'s flags is one edit.
fn serve_args(ip: Ipv4Addr, port: u16, data_dir: &std::path::Path) -> Vec<std::ffi::OsString> {
    vec![
        "serve".into(),
        "--listen".into(),
        format!("{ip}:{port}").into(),
        "--data-dir".into(),
        data_dir.as_os_str().to_owned(),
    ]
}

/// The URL of `addresses` for a client, with `options` (`""`, or a secured
/// cluster's `?ca=…&token_file=…`).
fn client_url(addresses: &[String], options: &str) -> String {
    let scheme = if options.is_empty() {
        "locksmith"
    } else {
        "locksmith+tls"
    };
    format!("{scheme}://{}{options}", addresses.join(","))
}

/// Where a cluster's members run, how many spares it keeps, and whether it
/// is secured.
#[derive(Debug, Clone, Copy, Default)]
pub struct Placement {
    /// Each member on a host of its own (network namespaces: root and
    /// iproute2), instead of all on loopback.
    pub separate_hosts: bool,
    /// Members prepared but not started, for membership changes.
    pub spares: usize,
    /// TLS between everyone, members certified by a CA of the run, and
    /// authentication on (module docs).
    pub secured: bool,
}

/// The files of a secured cluster: a CA made for the run, which signs one
/// member certificate naming every member's address (each presents it to
/// clients and to the other members, and checks theirs against the CA as the
/// peer CA), and an auth file whose one identity, the run's clients, holds every
/// permission on every name through a random token.
struct Security {
    certificates: Certificates,
    member_cert: PathBuf,
    member_key: PathBuf,
    token_file: PathBuf,
    auth_file: PathBuf,
    _dir: tempfile::TempDir,
}

impl Security {
    /// Makes the files for members at `ips` (needs `openssl`).
    fn make(ips: &[Ipv4Addr]) -> Result<Security, String> {
        let dir = tempfile::Builder::new()
            .prefix("locksmith-secured-")
            .tempdir()
            .map_err(|e| format!("cannot create a directory for certificates: {e}"))?;
        // Loopback too: the torture's clients reach members through fault
        // proxies on 127.0.0.1.
        let mut names: Vec<String> = ips
            .iter()
            .chain([&Ipv4Addr::LOCALHOST])
            .map(|ip| format!("IP:{ip}"))
            .collect();
        names.sort();
        names.dedup();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let certificates = Certificates::make(&dir.path().join("tls"), &names, None)
            .map_err(|e| format!("certificates for a secured cluster: {e}"))?;
        let (member_cert, member_key) = certificates
            .peer("member", &names)
            .map_err(|e| format!("certificates for a secured cluster: {e}"))?;
        let token = uuid::Uuid::new_v4().simple().to_string();
        let token_file = dir.path().join("token");
        let auth_file = dir.path().join("auth.toml");
        let auth = format!(
            "[[identity]]\nname = \"clients\"\ntoken_sha256 = \"{}\"\n\
             grants = [ {{ prefix = \"\", permissions = [\"lock\", \"inspect\", \"admin\"] }} ]\n",
            locksmith_server::token_sha256(&token)
        );
        std::fs::write(&token_file, token)
            .and_then(|()| std::fs::write(&auth_file, auth))
            .map_err(|e| format!("cannot write the auth files: {e}"))?;
        Ok(Security {
            certificates,
            member_cert,
            member_key,
            token_file,
            auth_file,
            _dir: dir,
        })
    }

    /// What `serve` adds: TLS, the peer CA and the auth file.
    fn serve_args(&self) -> Vec<OsString> {
        vec![
            "--tls-cert".into(),
            self.member_cert.clone().into(),
            "--tls-key".into(),
            self.member_key.clone().into(),
            "--tls-peer-ca".into(),
            self.certificates.ca_cert().into(),
            "--auth-file".into(),
            self.auth_file.clone().into(),
        ]
    }

    /// What a client's URL adds.
    fn client_options(&self) -> String {
        format!(
            "?ca={}&token_file={}",
            self.certificates.ca_cert().display(),
            self.token_file.display()
        )
    }
}

/// Where a member of a [`ServeCluster`] stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    Member,
    Spare,
    /// Removed from the cluster and stopped; its id is never used again.
    Retired,
}

/// `locksmith serve` processes forming one cluster.
pub struct ServeCluster {
    // Declared first: the processes are killed before the network goes.
    servers: Vec<ServeProcess>,
    standing: Mutex<Vec<Standing>>,
    network: Option<Network>,
    security: Option<Security>,
}

impl ServeCluster {
    /// Starts `voters` members forming one new cluster (ids 1 to `voters`),
    /// and prepares `placement.spares` more (the next ids) that join through
    /// every other member when started.
    pub fn start(voters: usize, placement: Placement) -> Result<ServeCluster, String> {
        let cluster = ServeCluster::prepare(voters, placement)?;
        cluster.launch()?;
        Ok(cluster)
    }

    /// A new cluster of `voters` members on loopback made from the backup
    /// at `backup` as an operator makes one: `locksmith snapshot restore`
    /// into each member's empty data directory, one after the other.
    /// Returns it, not started ([`ServeCluster::launch`]), with the time
    /// the slowest restore took (blocking).
    pub fn restore(
        backup: &std::path::Path,
        voters: usize,
    ) -> Result<(ServeCluster, Duration), String> {
        let cluster = ServeCluster::prepare(voters, Placement::default())?;
        let members = cluster
            .servers
            .iter()
            .map(|s| format!("{}={}", s.id, s.address()))
            .collect::<Vec<_>>()
            .join(",");
        let exe = crate::server_executable::path()?;
        let mut slowest = Duration::ZERO;
        for server in &cluster.servers {
            let started = std::time::Instant::now();
            let output = std::process::Command::new(&exe)
                .arg("snapshot")
                .arg("restore")
                .arg(backup)
                .arg("--data-dir")
                .arg(server.data_dir())
                .args(["--node-id", &server.id.to_string(), "--cluster", &members])
                .env("RUST_LOG", "warn")
                .stdin(std::process::Stdio::null())
                .output()
                .map_err(|e| format!("cannot run `locksmith snapshot restore`: {e}"))?;
            if !output.status.success() {
                return Err(format!(
                    "locksmith snapshot restore: {}",
                    String::from_utf8_lossy(&output.stderr).trim()
                ));
            }
            slowest = slowest.max(started.elapsed());
        }
        Ok((cluster, slowest))
    }

    /// Starts the members (not the spares), all at once, and waits until
    /// each accepts connections (blocking). A member listens only once it
    /// has recovered (read its snapshot and log), so they recover side by
    /// side.
    pub fn launch(&self) -> Result<(), String> {
        let members = self.members();
        for member in &members {
            member.process.start().map_err(|e| e.to_string())?;
        }
        members
            .into_iter()
            .try_for_each(|member| member.wait_ready().map_err(|e| e.to_string()))
    }

    /// The servers of a new cluster, prepared but not started.
    fn prepare(voters: usize, placement: Placement) -> Result<ServeCluster, String> {
        let slots = voters + placement.spares;
        let network = placement
            .separate_hosts
            .then(|| Network::create(slots).map_err(|e| format!("network namespaces: {e}")))
            .transpose()?;
        let hosts: Vec<Option<&Host>> = match &network {
            Some(network) => network.hosts().iter().map(Some).collect(),
            None => vec![None; slots],
        };
        let ports: Vec<u16> = (0..slots).map(|_| locksmith_testkit::free_port()).collect();
        let addresses: Vec<String> = hosts
            .iter()
            .zip(&ports)
            .map(|(host, port)| format!("{}:{port}", host.map_or(Ipv4Addr::LOCALHOST, |h| h.ip)))
            .collect();
        let security = placement
            .secured
            .then(|| {
                let ips: Vec<Ipv4Addr> = hosts
                    .iter()
                    .map(|host| host.map_or(Ipv4Addr::LOCALHOST, |h| h.ip))
                    .collect();
                Security::make(&ips)
            })
            .transpose()?;
        let initial = addresses[..voters]
            .iter()
            .zip(1..)
            .map(|(address, id)| format!("{id}={address}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut servers = Vec::with_capacity(slots);
        for slot in 0..slots {
            let id = slot as u64 + 1;
            let id_arg = id.to_string();
            let others = addresses
                .iter()
                .enumerate()
                .filter(|&(other, _)| other != slot)
                .map(|(_, address)| address.as_str())
                .collect::<Vec<_>>()
                .join(",");
            let extra: [&str; 4] = if slot < voters {
                ["--node-id", &id_arg, "--cluster", &initial]
            } else {
                ["--node-id", &id_arg, "--join", &others]
            };
            servers.push(ServeProcess::prepare(
                hosts[slot],
                ports[slot],
                id,
                &extra,
                security.as_ref(),
            )?);
        }
        let cluster = ServeCluster {
            standing: Mutex::new(
                std::iter::repeat_n(Standing::Member, voters)
                    .chain(std::iter::repeat_n(Standing::Spare, placement.spares))
                    .collect(),
            ),
            servers,
            network,
            security,
        };
        Ok(cluster)
    }

    fn standing(&self) -> MutexGuard<'_, Vec<Standing>> {
        self.standing.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The members of the cluster now (running or killed by a fault), not
    /// the spares and not those removed.
    pub fn members(&self) -> Vec<&ServeProcess> {
        let standing = self.standing();
        self.servers
            .iter()
            .zip(standing.iter())
            .filter(|(_, s)| **s == Standing::Member)
            .map(|(server, _)| server)
            .collect()
    }

    /// Every server of the cluster: members, spares (started or not) and
    /// those removed.
    pub fn every_server(&self) -> &[ServeProcess] {
        &self.servers
    }

    /// The URL clients use: every member's and every spare's address.
    pub fn url(&self) -> String {
        self.url_of(self.servers.iter().collect())
    }

    /// Changes the membership as an operator does: runs `locksmith cluster
    /// --server <the members now> CHANGE` (e.g. `["promote", "4"]`), which
    /// finds the leader; on failure, what the command said.
    ///
    /// Blocking: waits for the command.
    pub fn change_members(&self, change: &[&str]) -> Result<(), String> {
        let output = std::process::Command::new(crate::server_executable::path()?)
            .arg("cluster")
            .arg("--server")
            .arg(self.url_of(self.members()))
            .args(change)
            .env("RUST_LOG", "warn")
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("cannot run `locksmith cluster`: {e}"))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&output.stderr).trim().to_owned())
        }
    }

    fn url_of(&self, servers: Vec<&ServeProcess>) -> String {
        let addresses: Vec<String> = servers.into_iter().map(ServeProcess::address).collect();
        let options = self.security.as_ref().map(Security::client_options);
        client_url(&addresses, &options.unwrap_or_default())
    }

    /// The network the members' hosts share, when they run on hosts of their
    /// own.
    pub fn network(&self) -> Option<&Network> {
        self.network.as_ref()
    }

    /// The position of `member` among the hosts of [`ServeCluster::network`].
    pub fn host_of(&self, member: &ServeProcess) -> usize {
        self.servers
            .iter()
            .position(|s| s.id == member.id)
            .expect("a member of this cluster")
    }

    /// Waits until every member accepts connections.
    pub fn wait_ready(&self) -> locksmith_testkit::Result<()> {
        self.members()
            .into_iter()
            .try_for_each(ServeProcess::wait_ready)
    }

    /// The leader among the members other than `except`, once one serves
    /// (blocking: up to 20 s).
    pub fn leader(&self, except: Option<u64>) -> Result<&ServeProcess, String> {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let found = self
                .members()
                .into_iter()
                .find(|m| Some(m.id) != except && m.process.is_running() && m.leads());
            if let Some(leader) = found {
                return Ok(leader);
            }
            if std::time::Instant::now() >= deadline {
                return Err("no member of the locksmith cluster serves as leader".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts the next spare, which joins the cluster as a learner by itself
    /// (blocking: until it accepts connections). It counts as a member from
    /// now on.
    pub fn start_spare(&self) -> Result<&ServeProcess, String> {
        let slot = {
            let mut standing = self.standing();
            let slot = standing
                .iter()
                .position(|s| *s == Standing::Spare)
                .ok_or("no spare member left")?;
            standing[slot] = Standing::Member;
            slot
        };
        let spare = &self.servers[slot];
        spare.launch()?;
        Ok(spare)
    }

    /// Whether a spare is left to start.
    pub fn has_spare(&self) -> bool {
        self.standing().contains(&Standing::Spare)
    }

    /// Stops `member`, which the cluster no longer has; its id is not used
    /// again.
    pub fn retire(&self, member: &ServeProcess) {
        let slot = self.host_of(member);
        self.standing()[slot] = Standing::Retired;
        member.process.stop();
    }
}
