//! [`PgBouncer`]: a real PgBouncer in front of a [`Postgres`].

use std::fmt;
use std::fs;
use std::path::PathBuf;
use std::time::Duration;

use tempfile::TempDir;

use crate::find::{find_on_path, is_executable, not_installed};
use crate::postgres::{handshake, server_user};
use crate::process::{give, Process, ProcessSpec};
use crate::{free_port, impl_server, retry_on_port_clash, server_dir, Error, Postgres, Result};

/// Where Debian's `pgbouncer` package puts the binary (not on a user's `PATH`).
const DEBIAN_PGBOUNCER: &str = "/usr/sbin/pgbouncer";
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// When PgBouncer gives a server connection back to its pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// When the client disconnects: a client keeps one server session.
    Session,
    /// After each transaction: consecutive transactions of one client may run
    /// on different server sessions, and other clients use the same ones.
    Transaction,
}

impl fmt::Display for PoolMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
        })
    }
}

/// A PgBouncer on `127.0.0.1` in front of a [`Postgres`], in its own temporary
/// directory (generated `pgbouncer.ini` and `userlist.txt`), killed on drop.
///
/// It serves the database `postgres` to the user `postgres` with `trust`
/// authentication, pools at most 50 server connections and takes up to
/// 1000 clients. PgBouncer refuses to run as root: when the tests run as
/// root it runs as the user PostgreSQL runs as (`locksmith-pg`). The binary
/// is `pgbouncer` from `PATH`, else `/usr/sbin/pgbouncer` (Debian package
/// `pgbouncer`).
///
/// ```no_run
/// use locksmith_testkit::pgbouncer::{PgBouncer, PoolMode};
/// use locksmith_testkit::Postgres;
///
/// let pg = Postgres::start();
/// let bouncer = PgBouncer::start(&pg, PoolMode::Transaction);
/// let url = bouncer.url(); // postgres://postgres@127.0.0.1:<port>/postgres
/// ```
#[derive(Debug)]
pub struct PgBouncer {
    // Declared first so it is dropped (killed) before the directory is removed.
    process: Process,
    port: u16,
    pool_mode: PoolMode,
    dir: TempDir,
}

impl PgBouncer {
    /// Starts PgBouncer in front of `pg` in `pool_mode` on a free port and
    /// waits until a client can log in through it; panics on failure.
    #[track_caller]
    pub fn start(pg: &Postgres, pool_mode: PoolMode) -> PgBouncer {
        crate::or_panic(Self::try_start(pg, pool_mode))
    }

    /// Like [`PgBouncer::start`], returning the error instead of panicking.
    pub fn try_start(pg: &Postgres, pool_mode: PoolMode) -> Result<PgBouncer> {
        let binary = find_on_path("pgbouncer")
            .or_else(|| Some(PathBuf::from(DEBIAN_PGBOUNCER)).filter(|p| is_executable(p)))
            .ok_or_else(|| not_installed("pgbouncer", "pgbouncer"))?;
        let user = server_user()?;
        let dir = server_dir("pgbouncer")?;
        give(dir.path(), user)?;
        let userlist = dir.path().join("userlist.txt");
        write(&userlist, "\"postgres\" \"\"\n")?;
        let ini = dir.path().join("pgbouncer.ini");
        let (process, port) = retry_on_port_clash(|| {
            let port = free_port();
            write(
                &ini,
                &format!(
                    "[databases]\n\
                     postgres = host={host} port={pg_port} dbname=postgres user=postgres\n\
                     [pgbouncer]\n\
                     listen_addr = {host}\n\
                     listen_port = {port}\n\
                     unix_socket_dir =\n\
                     auth_type = trust\n\
                     auth_file = {userlist}\n\
                     pool_mode = {pool_mode}\n\
                     max_client_conn = 1000\n\
                     default_pool_size = 50\n\
                     ignore_startup_parameters = extra_float_digits\n",
                    host = crate::HOST,
                    pg_port = pg.port(),
                    userlist = userlist.display(),
                ),
            )?;
            let mut spec = ProcessSpec::new(
                format!("PgBouncer on port {port}"),
                &binary,
                dir.path().join("pgbouncer.log"),
            )
            .current_dir(dir.path())
            .arg(&ini)
            // SIGINT: "safe shutdown", waits for clients; SIGTERM closes at once.
            .stop_signal(libc::SIGTERM, Duration::from_secs(10));
            if let Some((uid, gid)) = user {
                spec = spec.user(uid, gid);
            }
            let process = Process::spawn(spec)?;
            process.wait_ready(READY_TIMEOUT, || probe(port))?;
            Ok((process, port))
        })?;
        Ok(PgBouncer {
            process,
            port,
            pool_mode,
            dir,
        })
    }

    /// Stops PgBouncer if it runs and starts it again on the same port,
    /// waiting until a client can log in (clients lose their connections).
    pub fn try_restart(&self) -> Result<()> {
        self.process.stop();
        self.process.start()?;
        self.process.wait_ready(READY_TIMEOUT, || probe(self.port))
    }

    /// The port PgBouncer listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The pool mode it runs in.
    pub fn pool_mode(&self) -> PoolMode {
        self.pool_mode
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@{}:{}/postgres", crate::HOST, self.port)
    }
}

impl_server!(PgBouncer, "pgbouncer");

fn write(path: &std::path::Path, text: &str) -> Result<()> {
    fs::write(path, text).map_err(|e| Error::io(format!("cannot write {}", path.display()), e))
}

/// A PostgreSQL login through PgBouncer (which connects to the server for it).
fn probe(port: u16) -> std::result::Result<(), String> {
    handshake(port, Duration::from_secs(2)).map_err(|e| e.to_string())
}
