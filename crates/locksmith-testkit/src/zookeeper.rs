//! [`ZooKeeper`]: a real standalone ZooKeeper server on a JVM.

use std::env;
use std::fs;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use tempfile::TempDir;

use crate::certs::Certificates;
use crate::netns::{self, Host};
use crate::process::Process;
use crate::{free_port, impl_server, retry_on_port_clash, server_dir, try_binary, Error, Result};

/// The JVM starts slowly, and much more slowly on a busy CI machine.
const READY_TIMEOUT: Duration = Duration::from_secs(90);
/// The timeout of each read and write of [`ZooKeeper::four_letter`].
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// Debian's `zookeeper` package (through `libzookeeper-java`) installs the server
/// jar here; its manifest's `Class-Path` lists every dependency jar.
const DEBIAN_JAR: &str = "/usr/share/java/zookeeper.jar";
/// slf4j's stderr logger (from `libslf4j-java`, a dependency of the package);
/// without a binding ZooKeeper logs nothing.
const SLF4J_SIMPLE: &str = "/usr/share/java/slf4j-simple.jar";
/// Netty's codecs (`libnetty-java`), for the secure client port.
const NETTY_CODEC: &str = "/usr/share/java/netty-codec.jar";
/// The entry point of a standalone server.
const STANDALONE_MAIN: &str = "org.apache.zookeeper.server.ZooKeeperServerMain";
/// The entry point of an ensemble member.
const QUORUM_MAIN: &str = "org.apache.zookeeper.server.quorum.QuorumPeerMain";
/// Overrides the classpath, for ZooKeeper installed some other way.
const CLASSPATH_VAR: &str = "LOCKSMITH_ZOOKEEPER_CLASSPATH";

/// The tick (ms). Session expiry is checked once per tick, so a small tick makes
/// expiry precise; the minimum session timeout is set to 1 s explicitly.
const TICK_MS: u32 = 500;
const MIN_SESSION_TIMEOUT_MS: u32 = 1_000;
const MAX_SESSION_TIMEOUT_MS: u32 = 60_000;

static SHARED: OnceLock<ZooKeeper> = OnceLock::new();

/// A standalone ZooKeeper server (`ZooKeeperServerMain`) on `127.0.0.1`, in its own
/// temporary directory, killed on drop.
///
/// It runs with `tickTime=500`, `minSessionTimeout=1000` (so tests can use
/// 1-second sessions), `maxSessionTimeout=60000`, every four-letter word enabled,
/// the admin server off, no per-client connection limit and a 256 MiB heap.
/// Transactions are fsynced, so [`kill`](ZooKeeper::kill) +
/// [`restart`](ZooKeeper::restart) keeps data and live sessions.
///
/// A JVM takes a second or more to start; tests that need no fresh server should
/// use [`ZooKeeper::shared`] and namespace their znodes.
///
/// [`ZooKeeper::start_tls`] adds a secure client port (Netty, PEM key and
/// trust stores from a CA of its own) that wants client certificates.
#[derive(Debug)]
pub struct ZooKeeper {
    // Declared first so it is dropped (killed) before the directory is removed.
    process: Process,
    /// Where it listens: loopback, or its host's address.
    ip: Ipv4Addr,
    port: u16,
    /// The secure client port and its certificates, for [`ZooKeeper::start_tls`].
    tls: Option<(u16, Certificates)>,
    dir: TempDir,
}

impl ZooKeeper {
    /// Starts a ZooKeeper on a free port and waits until it answers `srvr` as a
    /// serving standalone server; panics on failure (for example when ZooKeeper
    /// is not installed).
    #[track_caller]
    pub fn start() -> ZooKeeper {
        crate::or_panic(Self::try_start())
    }

    /// Like [`ZooKeeper::start`], returning the error instead of panicking.
    pub fn try_start() -> Result<ZooKeeper> {
        retry_on_port_clash(Self::launch)
    }

    /// One ZooKeeper for the whole test binary, started on first use and killed
    /// (its directory removed) when the process exits.
    ///
    /// Tests sharing it must not kill, pause or restart it, and should use their
    /// own znode paths (a random prefix). Under `cargo nextest`, every test is its
    /// own process and so gets its own server.
    #[track_caller]
    pub fn shared() -> &'static ZooKeeper {
        SHARED.get_or_init(|| {
            let zk = ZooKeeper::start();
            extern "C" fn cleanup() {
                if let Some(zk) = SHARED.get() {
                    zk.process.kill_now();
                    let _ = fs::remove_dir_all(zk.dir.path());
                }
            }
            // SAFETY: registers a plain `extern "C" fn` that runs at exit.
            unsafe { libc::atexit(cleanup) };
            zk
        })
    }

    fn launch() -> Result<ZooKeeper> {
        let port = free_port();
        let zk = Self::spawn(None, port, None, STANDALONE_MAIN, |data| {
            Ok(zoo_cfg(data, crate::HOST, port).into())
        })?;
        zk.wait_ready()?;
        Ok(zk)
    }

    /// Like [`ZooKeeper::start`], requiring SASL: every session must
    /// authenticate with DIGEST-MD5 as one of `users` (name, password), or
    /// it is closed (`sessionRequireClientSASLAuth`). The users are the JAAS
    /// `Server` section's (`DigestLoginModule`); a session's identity is
    /// `sasl:<name>`. Passwords must not contain `"` or `\`.
    #[track_caller]
    pub fn start_sasl(users: &[(&str, &str)]) -> ZooKeeper {
        crate::or_panic(Self::try_start_sasl(users))
    }

    /// Like [`ZooKeeper::start_sasl`], returning the error instead of
    /// panicking.
    pub fn try_start_sasl(users: &[(&str, &str)]) -> Result<ZooKeeper> {
        retry_on_port_clash(|| {
            let port = free_port();
            let zk = Self::spawn(None, port, None, STANDALONE_MAIN, |data| {
                let jaas = data.with_file_name("jaas.conf");
                let users: String = users
                    .iter()
                    .map(|(name, password)| format!("\n    user_{name}=\"{password}\""))
                    .collect();
                let section = format!(
                    "Server {{\n    org.apache.zookeeper.server.auth.DigestLoginModule required{users};\n}};\n"
                );
                fs::write(&jaas, section)
                    .map_err(|e| Error::io(format!("cannot write {}", jaas.display()), e))?;
                Ok(Setup {
                    zoo_cfg: format!(
                        "{}authProvider.1=org.apache.zookeeper.server.auth.SASLAuthenticationProvider\n\
                         sessionRequireClientSASLAuth=true\n",
                        zoo_cfg(data, crate::HOST, port)
                    ),
                    jvm_options: vec![format!(
                        "-Djava.security.auth.login.config={}",
                        jaas.display()
                    )],
                })
            })?;
            zk.wait_ready()?;
            Ok(zk)
        })
    }

    /// Like [`ZooKeeper::start`], with a secure client port as well
    /// ([`ZooKeeper::secure_port`]): TLS with a certificate for `localhost`
    /// and `127.0.0.1` signed by a CA made for this server
    /// ([`ZooKeeper::ca_cert`]), and only clients with a certificate of
    /// that CA ([`ZooKeeper::client_cert`]) let in. The plain port stays
    /// open (four-letter words, readiness). Needs `openssl`.
    #[track_caller]
    pub fn start_tls() -> ZooKeeper {
        crate::or_panic(Self::try_start_tls())
    }

    /// Like [`ZooKeeper::start_tls`], returning the error instead of
    /// panicking.
    pub fn try_start_tls() -> Result<ZooKeeper> {
        retry_on_port_clash(|| {
            let (port, secure_port) = (free_port(), free_port());
            let mut tls = None;
            let mut zk = Self::spawn(None, port, None, STANDALONE_MAIN, |data| {
                let certificates = Certificates::make(
                    &data.with_file_name("tls"),
                    &["DNS:localhost", "IP:127.0.0.1"],
                    None,
                )?;
                let secure = secure_cfg(&certificates, secure_port)?;
                tls = Some((secure_port, certificates));
                Ok(format!("{}{secure}", zoo_cfg(data, crate::HOST, port)).into())
            })?;
            zk.tls = tls;
            zk.wait_ready()?;
            Ok(zk)
        })
    }

    /// Starts server `id` (1, 2, …) of an ensemble whose `server.N=…` lines
    /// are `servers`, on `host` (loopback for `None`), without waiting: a
    /// member serves only once a majority of the ensemble runs.
    pub(crate) fn spawn_member(
        id: usize,
        host: Option<&Host>,
        port: u16,
        servers: &str,
    ) -> Result<ZooKeeper> {
        let ip = netns::address(host).to_string();
        Self::spawn(host, port, Some(id), QUORUM_MAIN, |data| {
            Ok(format!("{}{servers}", zoo_cfg(data, &ip, port)).into())
        })
    }

    fn spawn(
        host: Option<&Host>,
        port: u16,
        id: Option<usize>,
        main: &str,
        setup: impl FnOnce(&Path) -> Result<Setup>,
    ) -> Result<ZooKeeper> {
        let java = try_binary("java", "default-jre-headless")?;
        let classpath = classpath()?;
        let dir = server_dir("zookeeper")?;
        let data = dir.path().join("data");
        fs::create_dir(&data)
            .map_err(|e| Error::io(format!("cannot create {}", data.display()), e))?;
        if let Some(id) = id {
            let myid = data.join("myid");
            fs::write(&myid, format!("{id}\n"))
                .map_err(|e| Error::io(format!("cannot write {}", myid.display()), e))?;
        }
        let file = dir.path().join("zoo.cfg");
        let setup = setup(&data)?;
        fs::write(&file, setup.zoo_cfg)
            .map_err(|e| Error::io(format!("cannot write {}", file.display()), e))?;
        let ip = netns::address(host);
        let name = match id {
            Some(id) => format!("ZooKeeper server {id} on {ip}:{port}"),
            None => format!("ZooKeeper on port {port}"),
        };
        let spec = netns::spec(host, name, java, dir.path().join("zookeeper.log"))
            .current_dir(dir.path())
            .args([
                "-Xmx256m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-XX:-UsePerfData",
                "-Djava.net.preferIPv4Stack=true",
                "-Dzookeeper.jmx.log4j.disable=true",
                "-Dzookeeper.admin.enableServer=false",
                "-Dorg.slf4j.simpleLogger.showDateTime=true",
                "-Dorg.slf4j.simpleLogger.defaultLogLevel=info",
            ])
            .args(setup.jvm_options)
            .arg("-cp")
            .arg(classpath)
            .arg(main)
            .arg(&file)
            // Transactions are fsynced before they are acknowledged, and the JVM's
            // shutdown is slow: a restart is a kill.
            .stop_signal(libc::SIGKILL, Duration::from_secs(5));
        Ok(ZooKeeper {
            process: Process::spawn(spec)?,
            ip,
            port,
            tls: None,
            dir,
        })
    }

    pub(crate) fn wait_ready(&self) -> Result<()> {
        self.process.wait_ready(READY_TIMEOUT, || {
            let answer = four_letter(self.address(), "srvr", Duration::from_millis(500))
                .map_err(|e| format!("srvr failed: {e}"))?;
            if answer.contains("Mode:") {
                Ok(())
            } else {
                Err(format!("srvr answered {:?}", answer.trim()))
            }
        })
    }

    /// Kills ZooKeeper if it runs and starts it again on the same port with the
    /// same data directory, waiting until it serves.
    pub fn try_restart(&self) -> Result<()> {
        self.process.stop();
        self.process.start()?;
        self.wait_ready()
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The client address: `127.0.0.1`, or its host's for a server of an
    /// ensemble on hosts of their own.
    pub fn address(&self) -> SocketAddr {
        SocketAddr::from((self.ip, self.port))
    }

    /// The secure client port of a server started with
    /// [`ZooKeeper::start_tls`].
    pub fn secure_port(&self) -> Option<u16> {
        self.tls.as_ref().map(|(port, _)| *port)
    }

    /// The CA certificate (PEM) of a server started with
    /// [`ZooKeeper::start_tls`].
    pub fn ca_cert(&self) -> Option<PathBuf> {
        self.tls
            .as_ref()
            .map(|(_, certificates)| certificates.ca_cert())
    }

    /// A client certificate and key (PEM files) for `common_name`, signed by
    /// the CA of a server started with [`ZooKeeper::start_tls`].
    pub fn client_cert(&self, common_name: &str) -> Option<Result<(PathBuf, PathBuf)>> {
        self.tls
            .as_ref()
            .map(|(_, certificates)| certificates.client(common_name))
    }

    /// `127.0.0.1:<port>`, the connect string ZooKeeper clients take.
    pub fn connect_string(&self) -> String {
        self.address().to_string()
    }

    /// `zk://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("zk://{}", self.address())
    }

    /// Sends a four-letter word (`srvr`, `ruok`, `stat`, `mntr`, `cons`, `dump`,
    /// ...) and returns the answer.
    pub fn four_letter(&self, word: &str) -> io::Result<String> {
        four_letter(self.address(), word, COMMAND_TIMEOUT)
    }
}

impl_server!(ZooKeeper, "zookeeper");

/// What a server starts from: its `zoo.cfg`, and JVM options beyond the
/// common ones.
struct Setup {
    zoo_cfg: String,
    jvm_options: Vec<String>,
}

impl From<String> for Setup {
    fn from(zoo_cfg: String) -> Setup {
        Setup {
            zoo_cfg,
            jvm_options: Vec::new(),
        }
    }
}

/// The generated `zoo.cfg`.
fn zoo_cfg(data: &Path, ip: &str, port: u16) -> String {
    format!(
        "tickTime={TICK_MS}\n\
         minSessionTimeout={MIN_SESSION_TIMEOUT_MS}\n\
         maxSessionTimeout={MAX_SESSION_TIMEOUT_MS}\n\
         initLimit=10\n\
         syncLimit=5\n\
         dataDir={}\n\
         clientPort={port}\n\
         clientPortAddress={ip}\n\
         maxClientCnxns=0\n\
         4lw.commands.whitelist=*\n\
         admin.enableServer=false\n\
         forceSync=yes\n",
        data.display(),
    )
}

/// The JVM classpath of the server.
/// The secure client port: Netty (the only server connection factory that
/// speaks TLS), PEM stores (ZooKeeper reads a key and its certificate from
/// one file), client certificates required (`ssl.clientAuth=need`, the
/// default).
fn secure_cfg(certificates: &Certificates, secure_port: u16) -> Result<String> {
    let keystore = certificates.server_cert().with_file_name("server.pem");
    let pem = [certificates.server_key(), certificates.server_cert()]
        .iter()
        .map(fs::read_to_string)
        .collect::<io::Result<Vec<_>>>()
        .and_then(|parts| fs::write(&keystore, parts.concat()))
        .map_err(|e| Error::io(format!("cannot write {}", keystore.display()), e));
    pem?;
    Ok(format!(
        "secureClientPort={secure_port}\n\
         serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
         ssl.keyStore.location={}\n\
         ssl.keyStore.type=PEM\n\
         ssl.trustStore.location={}\n\
         ssl.trustStore.type=PEM\n",
        keystore.display(),
        certificates.ca_cert().display(),
    ))
}

fn classpath() -> Result<String> {
    if let Some(cp) = env::var_os(CLASSPATH_VAR).filter(|cp| !cp.is_empty()) {
        return Ok(cp.to_string_lossy().into_owned());
    }
    if !Path::new(DEBIAN_JAR).is_file() {
        return Err(Error::NotInstalled {
            name: "the ZooKeeper server jar".into(),
            looked_in: format!("at {DEBIAN_JAR} (or in ${CLASSPATH_VAR})"),
            package: "zookeeper".into(),
        });
    }
    let mut cp = vec![PathBuf::from(DEBIAN_JAR)];
    if Path::new(SLF4J_SIMPLE).is_file() {
        cp.push(SLF4J_SIMPLE.into());
    }
    // The manifest leaves out netty-codec, which Netty's TLS handler needs
    // (`NoClassDefFoundError: io/netty/handler/codec/ByteToMessageDecoder`
    // on the first TLS connection); Debian's libnetty-java has it.
    if Path::new(NETTY_CODEC).is_file() {
        cp.push(NETTY_CODEC.into());
    }
    Ok(env::join_paths(cp)
        .expect("constant paths contain no ':'")
        .to_string_lossy()
        .into_owned())
}

/// Sends the four-letter word `word` to `address` and reads the answer
/// until the server closes the connection.
pub(crate) fn four_letter(
    address: SocketAddr,
    word: &str,
    timeout: Duration,
) -> io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&address, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(word.as_bytes())?;
    let _ = stream.shutdown(Shutdown::Write);
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}
