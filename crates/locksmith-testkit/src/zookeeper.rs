//! [`ZooKeeper`]: a real standalone ZooKeeper server on a JVM.

use std::env;
use std::fs;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use tempfile::TempDir;

use crate::process::{Process, ProcessSpec};
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
#[derive(Debug)]
pub struct ZooKeeper {
    // Declared first so it is dropped (killed) before the directory is removed.
    process: Process,
    port: u16,
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
        let zk = Self::spawn(port, None, STANDALONE_MAIN, |data| zoo_cfg(data, port))?;
        zk.wait_ready()?;
        Ok(zk)
    }

    /// Starts server `id` (1, 2, …) of an ensemble whose `server.N=…` lines
    /// are `servers`, without waiting: a member serves only once a majority
    /// of the ensemble runs.
    pub(crate) fn spawn_member(id: usize, port: u16, servers: &str) -> Result<ZooKeeper> {
        Self::spawn(port, Some(id), QUORUM_MAIN, |data| {
            format!("{}{servers}", zoo_cfg(data, port))
        })
    }

    fn spawn(
        port: u16,
        id: Option<usize>,
        main: &str,
        config: impl FnOnce(&Path) -> String,
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
        fs::write(&file, config(&data))
            .map_err(|e| Error::io(format!("cannot write {}", file.display()), e))?;
        let name = match id {
            Some(id) => format!("ZooKeeper server {id} on port {port}"),
            None => format!("ZooKeeper on port {port}"),
        };
        let spec = ProcessSpec::new(name, java, dir.path().join("zookeeper.log"))
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
            .arg("-cp")
            .arg(classpath)
            .arg(main)
            .arg(&file)
            // Transactions are fsynced before they are acknowledged, and the JVM's
            // shutdown is slow: a restart is a kill.
            .stop_signal(libc::SIGKILL, Duration::from_secs(5));
        Ok(ZooKeeper {
            process: Process::spawn(spec)?,
            port,
            dir,
        })
    }

    pub(crate) fn wait_ready(&self) -> Result<()> {
        self.process.wait_ready(READY_TIMEOUT, || {
            let answer = four_letter(self.port, "srvr", Duration::from_millis(500))
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

    /// `127.0.0.1:<port>`, the connect string ZooKeeper clients take.
    pub fn connect_string(&self) -> String {
        format!("{}:{}", crate::HOST, self.port)
    }

    /// `zk://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("zk://{}:{}", crate::HOST, self.port)
    }

    /// Sends a four-letter word (`srvr`, `ruok`, `stat`, `mntr`, `cons`, `dump`,
    /// ...) and returns the answer.
    pub fn four_letter(&self, word: &str) -> io::Result<String> {
        four_letter(self.port, word, COMMAND_TIMEOUT)
    }
}

impl_server!(ZooKeeper, "zookeeper");

/// The generated `zoo.cfg`.
fn zoo_cfg(data: &Path, port: u16) -> String {
    format!(
        "tickTime={TICK_MS}\n\
         minSessionTimeout={MIN_SESSION_TIMEOUT_MS}\n\
         maxSessionTimeout={MAX_SESSION_TIMEOUT_MS}\n\
         initLimit=10\n\
         syncLimit=5\n\
         dataDir={}\n\
         clientPort={port}\n\
         clientPortAddress={}\n\
         maxClientCnxns=0\n\
         4lw.commands.whitelist=*\n\
         admin.enableServer=false\n\
         forceSync=yes\n",
        data.display(),
        crate::HOST,
    )
}

/// The JVM classpath of the server.
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
    Ok(env::join_paths(cp)
        .expect("constant paths contain no ':'")
        .to_string_lossy()
        .into_owned())
}

/// Sends the four-letter word `word` to `127.0.0.1:port` and reads the answer
/// until the server closes the connection.
pub(crate) fn four_letter(port: u16, word: &str, timeout: Duration) -> io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&crate::loopback(port), timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(word.as_bytes())?;
    let _ = stream.shutdown(Shutdown::Write);
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}
