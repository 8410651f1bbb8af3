//! [`Postgres`]: a real PostgreSQL cluster of its own.

use std::env;
use std::ffi::CString;
use std::fs;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::thread;
use std::time::Duration;

use tempfile::TempDir;

use crate::certs::Certificates;
use crate::find::{find_on_path, is_executable, not_installed};
use crate::process::{self, give, Process, ProcessSpec};
use crate::{free_port, impl_server, retry_on_port_clash, server_dir, Error, Result};

/// How long PostgreSQL gets to accept a connection (after crash recovery too).
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// The system user PostgreSQL runs as when the tests run as root (PostgreSQL
/// refuses to run as root).
pub(crate) const PG_USER: &str = "locksmith-pg";
/// Overrides where `postgres`, `initdb`, `psql` are taken from.
const BINDIR_VAR: &str = "LOCKSMITH_PG_BINDIR";
/// Where Debian's `postgresql-<version>` packages put the server binaries.
const DEBIAN_PG_DIR: &str = "/usr/lib/postgresql";
/// The database user and database every test uses.
const USER: &str = "postgres";
const DATABASE: &str = "postgres";

/// A PostgreSQL cluster (`initdb` + `postgres`) on `127.0.0.1`, in its own
/// temporary directory, killed on drop.
///
/// The cluster is a copy of one made by `initdb` once a day and kept in the
/// temporary directory (about 40 MB, `locksmith-pg-template-*`; those of two
/// days ago or more are removed), which costs a tenth of running `initdb`.
///
/// Authentication is `trust`; the superuser is `postgres`. `fsync` stays on, so
/// committed data survives [`kill`](Postgres::kill) + [`restart`](Postgres::restart)
/// (crash recovery). When the tests run as root, the cluster is owned by and runs
/// as the system user `locksmith-pg`, created on first use.
///
/// The binaries come from `$LOCKSMITH_PG_BINDIR`, else from the directory of the
/// `postgres` found on `PATH`, else from the newest `/usr/lib/postgresql/*/bin`
/// (where Debian's `postgresql` package puts them).
///
/// ```no_run
/// use locksmith_testkit::Postgres;
///
/// let pg = Postgres::start();
/// assert_eq!(pg.query("select 1").unwrap(), "1");
/// ```
///
/// [`Postgres::start_tls`] starts one that also speaks TLS, with a certificate
/// of its own CA ([`Postgres::ca_cert`]); its user [`Postgres::CERT_USER`]
/// logs in only over TLS with a client certificate of that CA
/// ([`Postgres::client_cert`]).
#[derive(Debug)]
pub struct Postgres {
    // Declared first so it is dropped (killed) before the directory is removed.
    process: Process,
    port: u16,
    dir: TempDir,
    bin_dir: PathBuf,
    certificates: Option<Certificates>,
}

impl Postgres {
    /// The user of a TLS server ([`Postgres::start_tls`]) that is let in
    /// only with a client certificate naming it (`cert` authentication, over
    /// TLS only), into database `postgres`.
    pub const CERT_USER: &'static str = "locksmith_cert";

    /// Creates a cluster, starts it on a free port and waits until it accepts a
    /// connection; panics on failure (for example when PostgreSQL is not
    /// installed).
    #[track_caller]
    pub fn start() -> Postgres {
        crate::or_panic(Self::try_start())
    }

    /// Like [`Postgres::start`], returning the error instead of panicking.
    pub fn try_start() -> Result<Postgres> {
        Self::try_start_with(false)
    }

    /// Like [`Postgres::start`], with TLS on (`ssl=on`): the server's
    /// certificate, for `localhost` only (not `127.0.0.1`, so a client that
    /// checks host names against [`url`](Postgres::url) must refuse it), is
    /// signed by a CA made for this server ([`ca_cert`](Postgres::ca_cert)).
    /// Clients may still connect without TLS; `pg_stat_ssl` tells which did.
    /// Needs `openssl`.
    #[track_caller]
    pub fn start_tls() -> Postgres {
        crate::or_panic(Self::try_start_with(true))
    }

    /// Like [`Postgres::start_tls`], returning the error instead of panicking.
    pub fn try_start_tls() -> Result<Postgres> {
        Self::try_start_with(true)
    }

    fn try_start_with(tls: bool) -> Result<Postgres> {
        let bin_dir = bin_dir()?;
        let initdb = tool(&bin_dir, "initdb", "postgresql")?;
        let postgres = tool(&bin_dir, "postgres", "postgresql")?;
        let user = server_user()?;
        let dir = server_dir("postgres")?;
        give(dir.path(), user)?;
        let data = dir.path().join("data");
        let template = initdb_template(&initdb, user)?;
        process::run(
            Command::new("cp")
                .arg("-a")
                .arg("--")
                .arg(&template)
                .arg(&data),
            user,
        )?;
        // Sizes in postgresql.conf rather than on the command line, where
        // they would win over `ALTER SYSTEM`: a test that needs more room
        // raises them with `ALTER SYSTEM` and a restart.
        let conf = data.join("postgresql.conf");
        let mut settings = fs::OpenOptions::new()
            .append(true)
            .open(&conf)
            .map_err(|e| Error::io(format!("cannot open {}", conf.display()), e))?;
        settings
            .write_all(b"\nmax_connections = 200\nshared_buffers = 32MB\n")
            .map_err(|e| Error::io(format!("cannot write {}", conf.display()), e))?;
        let tls_files = if tls {
            let hba = data.join("pg_hba.conf");
            let trusted = fs::read_to_string(&hba)
                .map_err(|e| Error::io(format!("cannot read {}", hba.display()), e))?;
            let cert_user = Self::CERT_USER;
            fs::write(
                &hba,
                format!(
                    "hostssl all {cert_user} 127.0.0.1/32 cert\n\
                     host all {cert_user} 127.0.0.1/32 reject\n{trusted}"
                ),
            )
            .map_err(|e| Error::io(format!("cannot write {}", hba.display()), e))?;
            Some(Certificates::make(
                &dir.path().join("tls"),
                &["DNS:localhost"],
                user,
            )?)
        } else {
            None
        };
        let (process, port) = retry_on_port_clash(|| {
            let port = free_port();
            let mut spec = ProcessSpec::new(
                format!("PostgreSQL on port {port}"),
                &postgres,
                dir.path().join("postgres.log"),
            )
            .current_dir(dir.path())
            .env("LC_ALL", "C")
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string()])
            .arg("-k")
            .arg(dir.path())
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "logging_collector=off"])
            // Dynamic shared memory in files of the data directory, not in
            // /dev/shm: a server killed with SIGKILL (a crash test, or the
            // test process's end) leaves its segments behind, about 1 MiB of
            // memory each time, and only the directory is swept.
            .args(["-c", "dynamic_shared_memory_type=mmap"]);
            if let Some(files) = &tls_files {
                spec = spec
                    .args(["-c", "ssl=on"])
                    .arg("-c")
                    .arg(format!("ssl_cert_file={}", files.server_cert().display()))
                    .arg("-c")
                    .arg(format!("ssl_key_file={}", files.server_key().display()))
                    .arg("-c")
                    .arg(format!("ssl_ca_file={}", files.ca_cert().display()));
            }
            spec = spec
                // SIGINT is PostgreSQL's "fast" shutdown: roll back, checkpoint, exit.
                .stop_signal(libc::SIGINT, Duration::from_secs(30));
            if let Some((uid, gid)) = user {
                spec = spec.user(uid, gid);
            }
            let process = Process::spawn(spec)?;
            process.wait_ready(READY_TIMEOUT, || probe(port))?;
            Ok((process, port))
        })?;
        let postgres = Postgres {
            process,
            port,
            dir,
            bin_dir,
            certificates: tls_files,
        };
        if tls {
            let user = Self::CERT_USER;
            postgres.query(&format!(
                "create role {user} login; grant create on database {DATABASE} to {user}"
            ))?;
        }
        Ok(postgres)
    }

    fn wait_ready(&self) -> Result<()> {
        self.process.wait_ready(READY_TIMEOUT, || probe(self.port))
    }

    /// Stops PostgreSQL if it runs (fast shutdown, then `SIGKILL`) and starts it
    /// again on the same port with the same data directory (running crash recovery
    /// after a [`kill`](Postgres::kill)), waiting until it accepts connections.
    pub fn try_restart(&self) -> Result<()> {
        self.process.stop();
        // The postmaster is dead and reaped, so its lock file is stale; a reused
        // pid must not make the new postmaster think it still runs.
        let _ = fs::remove_file(self.dir.path().join("data").join("postmaster.pid"));
        let mut attempt = 1;
        loop {
            self.process.start()?;
            match self.wait_ready() {
                // Backends of the killed server may still be exiting and hold the
                // old shared memory for a moment.
                Err(Error::Exited { ref tail, .. })
                    if attempt < 5 && tail.contains("shared memory block") =>
                {
                    attempt += 1;
                    thread::sleep(Duration::from_millis(500));
                }
                other => return other,
            }
        }
    }

    /// The port PostgreSQL listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://{USER}@{}:{}/{DATABASE}", crate::HOST, self.port)
    }

    /// The CA certificate (PEM) that signed the server's certificate, for a
    /// server started with [`Postgres::start_tls`].
    pub fn ca_cert(&self) -> Option<PathBuf> {
        self.certificates.as_ref().map(Certificates::ca_cert)
    }

    /// A client certificate and key (PEM files) for [`Postgres::CERT_USER`],
    /// made on each call, signed by the CA of a server started with
    /// [`Postgres::start_tls`]; `None` for a server without TLS.
    pub fn client_cert(&self) -> Option<Result<(PathBuf, PathBuf)>> {
        self.certificates
            .as_ref()
            .map(|certificates| certificates.client(Self::CERT_USER))
    }

    /// The directory holding `postgres`, `initdb` (and usually `psql`) in use.
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// A `psql` command connected to this server as `postgres` to database
    /// `postgres`, with `-X -q -v ON_ERROR_STOP=1`; add the rest, like
    /// `.args(["-c", "select 1"])`. Panics if `psql` is not installed (Debian
    /// package `postgresql-client`).
    #[track_caller]
    pub fn psql(&self) -> Command {
        let psql = crate::or_panic(tool(&self.bin_dir, "psql", "postgresql-client"));
        let mut command = Command::new(psql);
        command
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1"])
            .args(["-h", crate::HOST, "-p", &self.port.to_string()])
            .args(["-U", USER, "-d", DATABASE])
            .env("PGCONNECT_TIMEOUT", "10");
        command
    }

    /// Runs `sql` with `psql -A -t -c` and returns its output, trimmed (rows on
    /// lines, columns separated by `|`).
    pub fn query(&self, sql: &str) -> Result<String> {
        let output = process::run(self.psql().args(["-A", "-t", "-c", sql]), None)?;
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    }
}

impl_server!(Postgres, "postgres");

/// What the names of [`initdb_template`]'s templates start with.
const TEMPLATE_PREFIX: &str = "locksmith-pg-template-";
const DAY: u64 = 24 * 60 * 60;

/// Whether `name` in the temporary directory, last changed `age` ago, is
/// an [`initdb_template`] of two days ago or more, which no run uses: each
/// day has its own.
pub(crate) fn is_stale_template(name: &str, age: Duration) -> bool {
    name.starts_with(TEMPLATE_PREFIX) && age.as_secs() > 2 * DAY
}

/// A cluster fresh from `initdb`, made once per machine, PostgreSQL build
/// and server user, which each server copies: `initdb` takes about a
/// CPU-second, a copy a tenth of that, and a run of the suite starts some
/// thirty servers, each test in a process of its own (nextest).
///
/// It stays in the temporary directory (about 40 MB) for the day's later
/// runs; a PostgreSQL upgrade (another `initdb`) makes a new one. A new one
/// is made each day, and the sweep of server directories removes those
/// more than two days old ([`is_stale_template`]): a cleaner of old files
/// in the temporary directory (systemd-tmpfiles, after ten days) could
/// otherwise take files out of a template still in use. Made in a
/// directory of its own and renamed into place when complete, so processes
/// racing to make it never see half of one.
fn initdb_template(initdb: &Path, user: Option<(u32, u32)>) -> Result<PathBuf> {
    use std::hash::{Hash, Hasher};
    use std::os::unix::fs::MetadataExt;

    let built = fs::metadata(initdb)
        .map_err(|e| Error::io(format!("cannot read {}", initdb.display()), e))?;
    let today = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs() / DAY);
    let mut key = std::collections::hash_map::DefaultHasher::new();
    (
        initdb,
        built.len(),
        built.mtime(),
        built.mtime_nsec(),
        user,
        today,
    )
        .hash(&mut key);
    let template = env::temp_dir().join(format!("{TEMPLATE_PREFIX}{:016x}", key.finish()));
    if template.join("PG_VERSION").exists() {
        return Ok(template);
    }
    // A server directory, so that a process killed during initdb leaves
    // nothing behind once swept.
    let making = server_dir("postgres-template")?;
    give(making.path(), user)?;
    let data = making.path().join("data");
    process::run(
        Command::new(initdb)
            .arg("-D")
            .arg(&data)
            .args(["-A", "trust", "-U", USER, "-E", "UTF8", "--locale=C"])
            .args(["--no-sync", "--no-instructions"])
            .current_dir(making.path())
            .env("LC_ALL", "C"),
        user,
    )?;
    // Another process may have put its template in place meanwhile: the
    // rename then fails, and that one is as good.
    match fs::rename(&data, &template) {
        Err(e) if !template.join("PG_VERSION").exists() => Err(Error::io(
            format!("cannot move the initdb cluster to {}", template.display()),
            e,
        )),
        _ => Ok(template),
    }
}

/// The directory to take the PostgreSQL binaries from.
fn bin_dir() -> Result<PathBuf> {
    if let Some(dir) = env::var_os(BINDIR_VAR).filter(|d| !d.is_empty()) {
        return Ok(dir.into());
    }
    if let Some(postgres) = find_on_path("postgres") {
        // /usr/local/bin/postgres may be a symlink into /usr/lib/postgresql/N/bin,
        // whose initdb must be the one of the same version.
        let real = fs::canonicalize(&postgres).unwrap_or(postgres);
        if let Some(dir) = real.parent() {
            return Ok(dir.to_owned());
        }
    }
    let newest = fs::read_dir(DEBIAN_PG_DIR)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version: f64 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            is_executable(&bin.join("postgres")).then_some((version, bin))
        })
        .max_by(|a, b| a.0.total_cmp(&b.0));
    newest
        .map(|(_, bin)| bin)
        .ok_or_else(|| Error::NotInstalled {
            name: "postgres".into(),
            looked_in: format!("on PATH or in {DEBIAN_PG_DIR}/*/bin"),
            package: "postgresql".into(),
        })
}

/// `name` from `bin_dir`, else from `PATH`.
fn tool(bin_dir: &Path, name: &str, package: &str) -> Result<PathBuf> {
    let path = bin_dir.join(name);
    if is_executable(&path) {
        return Ok(path);
    }
    find_on_path(name).ok_or_else(|| not_installed(name, package))
}

/// `(uid, gid)` to run PostgreSQL as: `None` for the current user, or the
/// `locksmith-pg` system user (created if needed) when running as root.
pub(crate) fn server_user() -> Result<Option<(u32, u32)>> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    static USER: OnceLock<(u32, u32)> = OnceLock::new();
    static CREATING: Mutex<()> = Mutex::new(());
    if let Some(user) = USER.get() {
        return Ok(Some(*user));
    }
    let _creating = CREATING.lock().unwrap_or_else(|p| p.into_inner());
    let useradd = find_on_path("useradd")
        .or_else(|| Some(PathBuf::from("/usr/sbin/useradd")).filter(|p| is_executable(p)))
        .ok_or_else(|| not_installed("useradd", "passwd"))?;
    // Other test processes (nextest) may be creating the user at the same time;
    // useradd then fails, and the user exists a moment later.
    let mut last_error = None;
    for _ in 0..50 {
        if let Some(user) = lookup_user(PG_USER) {
            return Ok(Some(*USER.get_or_init(|| user)));
        }
        match process::run(
            Command::new(&useradd)
                .args(["--system", "--user-group", "--no-create-home"])
                .args(["--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin"])
                .arg(PG_USER),
            None,
        ) {
            Ok(_) => {}
            Err(e) => {
                last_error = Some(e);
                thread::sleep(Duration::from_millis(100));
            }
        }
    }
    Err(last_error.unwrap_or_else(|| {
        Error::io(
            format!("cannot find user {PG_USER} after creating it"),
            io::ErrorKind::NotFound.into(),
        )
    }))
}

/// `(uid, gid)` of the user `name`, if it exists.
fn lookup_user(name: &str) -> Option<(u32, u32)> {
    let name = CString::new(name).ok()?;
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: getpwnam_r writes into `pwd` and `buf`, both ours and large enough
    // (it reports ERANGE otherwise); `result` points to `pwd` or is null.
    unsafe {
        let mut pwd: libc::passwd = std::mem::zeroed();
        let mut result = std::ptr::null_mut();
        let rc = libc::getpwnam_r(
            name.as_ptr(),
            &mut pwd,
            buf.as_mut_ptr(),
            buf.len(),
            &mut result,
        );
        (rc == 0 && !result.is_null()).then_some((pwd.pw_uid, pwd.pw_gid))
    }
}

/// Connects to `127.0.0.1:port` and completes a PostgreSQL startup handshake as
/// `postgres` to database `postgres` (trust authentication) until
/// `ReadyForQuery`.
fn probe(port: u16) -> std::result::Result<(), String> {
    handshake(port, Duration::from_millis(500)).map_err(|e| e.to_string())
}

/// A startup handshake on `127.0.0.1:port` (PostgreSQL's protocol, also
/// PgBouncer's), until `ReadyForQuery`.
pub(crate) fn handshake(port: u16, timeout: Duration) -> io::Result<()> {
    let mut stream = TcpStream::connect_timeout(&crate::loopback(port), timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let mut body = 196_608_i32.to_be_bytes().to_vec(); // protocol 3.0
    for (key, value) in [("user", USER), ("database", DATABASE)] {
        body.extend_from_slice(key.as_bytes());
        body.push(0);
        body.extend_from_slice(value.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut startup = ((body.len() + 4) as i32).to_be_bytes().to_vec();
    startup.extend_from_slice(&body);
    stream.write_all(&startup)?;
    loop {
        let mut header = [0u8; 5];
        stream.read_exact(&mut header)?;
        let len = i32::from_be_bytes([header[1], header[2], header[3], header[4]]);
        let mut payload = vec![0u8; (len.max(4) - 4) as usize];
        stream.read_exact(&mut payload)?;
        match header[0] {
            b'Z' => {
                // Terminate, politely.
                let _ = stream.write_all(&[b'X', 0, 0, 0, 4]);
                return Ok(());
            }
            b'R' if payload.get(..4) != Some(&[0, 0, 0, 0]) => {
                return Err(io::Error::other("the server asks for a password"));
            }
            b'E' => {
                // Fields: a type byte then a C string; 'M' is the message.
                let message = payload
                    .split(|b| *b == 0)
                    .find(|field| field.first() == Some(&b'M'))
                    .map(|field| String::from_utf8_lossy(&field[1..]).into_owned())
                    .unwrap_or_else(|| "unknown error".into());
                return Err(io::Error::other(message));
            }
            _ => {} // AuthenticationOk, ParameterStatus, BackendKeyData, notices
        }
    }
}
