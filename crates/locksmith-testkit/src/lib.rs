//! Real servers for locksmith's tests, benchmarks and torture runs.
//!
//! Every backend of locksmith is tested against the real thing: this crate starts
//! `redis-server`, ZooKeeper, `etcd` and PostgreSQL from the binaries installed on
//! the machine, each in its own temporary directory and on a free port of
//! `127.0.0.1`, and waits until the server answers its own protocol (a Redis
//! `PING`, a ZooKeeper `srvr`, an etcd `GET /health`, a PostgreSQL startup
//! handshake) before handing it over. Dropping the handle kills the server and
//! removes its directory.
//!
//! ```no_run
//! use locksmith_testkit::Redis;
//!
//! let redis = Redis::start();
//! assert_eq!(redis.query(&["SET", "k", "v"]).unwrap().as_str(), Some("OK"));
//! redis.kill(); // kill -9: the append-only file is fsynced on every write
//! redis.restart(); // same port, same directory
//! assert_eq!(redis.query(&["GET", "k"]).unwrap().as_str(), Some("v"));
//! ```
//!
//! # Design
//!
//! * **Blocking std API.** Everything is plain `std::process` and `std::net`, so it
//!   works from synchronous tests, from `#[tokio::test]` and from the torture tool
//!   alike. Handles are `Send + Sync` and all methods take `&self`, so a fault
//!   injector can share a server (`Arc<Redis>`) with the code under test.
//! * **No silent skips.** A missing binary is an error (a panic from the
//!   `start` constructors) naming the Debian package that installs it; see
//!   [`binary`]. `scripts/test` installs all of them.
//! * **No leaks.** Every server runs in its own process group and gets
//!   `PR_SET_PDEATHSIG = SIGKILL`, so it dies with the test process even when the
//!   test crashes or is killed. Processes are spawned from one long-lived thread
//!   because the parent-death signal fires when the *thread* that forked exits.
//! * **Faults.** [`Process`] is the building block shared by all servers: it
//!   kills (`SIGKILL` to the whole process group), pauses (`SIGSTOP`), resumes
//!   (`SIGCONT`) and restarts the server, and keeps its output in a log file whose
//!   tail is put into every startup error.
//!
//! # Servers
//!
//! | type          | binaries (Debian package)                                  |
//! |---------------|------------------------------------------------------------|
//! | [`Redis`]     | `redis-server` (`redis-server`); `redis-cli` (`redis-tools`) for a cluster |
//! | [`ZooKeeper`] | `java` + `/usr/share/java/zookeeper.jar` (`zookeeper`)     |
//! | [`Etcd`]      | `etcd` (`etcd-server`), `etcdctl` (`etcd-client`)          |
//! | [`Postgres`]  | `postgres`, `initdb` (`postgresql`), `psql` (`postgresql-client`) |
//! | [`netns::Network`] | `ip` (`iproute2`), as root: hosts in network namespaces |
//!
//! Replicated setups start several of these as one and wait until it is
//! healthy: [`RedisSentinel`] (a primary, replicas and Sentinels),
//! [`RedisCluster`], [`EtcdCluster`] and [`ZooKeeperEnsemble`]. Their members
//! are the handles above, so one member can be killed, paused or restarted
//! for a failover; each setup can also name its current primary or leader.
//!
//! Secured as operators run them: [`Postgres::start_tls`] (a user let in
//! by client certificate only), [`Etcd::start_tls`] (TLS only, client
//! certificates required), [`Etcd::start_auth`] (authentication on),
//! [`ZooKeeper::start_tls`] (a secure client port), and [`Redis::start_tls`],
//! [`RedisSentinel::start_tls`] and [`RedisCluster::start_tls`] (every port,
//! replication and the cluster bus on TLS only, client certificates
//! required); the CA, server and client certificates come from
//! [`Certificates`] (`openssl`). The testkit's own commands to a Redis go
//! through a Unix socket beside its port ([`Redis::query`]).
//!
//! On hosts of their own: `try_start_on_hosts` puts every member of a
//! [`RedisSentinel`], [`RedisCluster`], [`EtcdCluster`] or
//! [`ZooKeeperEnsemble`] on a host of its own ([`netns::Network`], as root),
//! so that one member can be cut off from the others
//! ([`netns::Network::cut`]) while clients on this machine still reach
//! every member.
//!
//! With the cargo feature `proxy`, `proxy::Route` puts a fault proxy in
//! front of each host of a store's URL for one client, so that exactly
//! that client can be cut off (a blackhole), slowed down or refused.
//!
//! [`pgbouncer::PgBouncer`] puts a real PgBouncer (`pgbouncer`) in front of a
//! [`Postgres`], in session or transaction pooling mode.
//!
//! Each has `start()` (panics with a readable message) and `try_start()`
//! (returns [`Error`]), `port()`, `url()`, `kill()`, `restart()`, `pause()`,
//! `resume()` and `is_running()`. The [`Server`] trait offers the same operations
//! for code that handles every backend alike.
//!
//! # The conformance suite
//!
//! With the cargo feature `conformance`, [`conformance`] ships the suite
//! every backend of locksmith passes: a backend written outside this
//! repository implements its `Harness` and expands
//! [`conformance_suite!`] in an integration test to run the same
//! behaviours, with the faults its harness can inject.
//!
//! # Where the binaries come from
//!
//! Nothing is bundled or downloaded: each server is found on the machine when
//! it is started, at run time, so a program built with this crate (the
//! `locksmith-lab` command's `bench --spawn …` and `torture --spawn …`) uses
//! whatever the machine it runs on has installed, the same way the tests do:
//!
//! - `redis-server`, `redis-cli`, `etcd`, `etcdctl`, `openssl`, `java`: the first
//!   executable of that name on `PATH`.
//! - PostgreSQL (`postgres`, `initdb`, `psql`): the directory in
//!   `LOCKSMITH_PG_BINDIR`, else that of `postgres` on `PATH`, else the newest
//!   `/usr/lib/postgresql/<version>/bin` (where Debian keeps them, off
//!   `PATH`); a tool missing there is looked for on `PATH`.
//! - `pgbouncer`: on `PATH`, else `/usr/sbin/pgbouncer` (Debian).
//! - ZooKeeper: the classpath in `LOCKSMITH_ZOOKEEPER_CLASSPATH`, else
//!   Debian's `/usr/share/java/zookeeper.jar` (whose manifest names its
//!   dependencies), run by `java`.
//!
//! On Debian or Ubuntu, `scripts/test --install-only` in the locksmith
//! repository installs all of them; the packages are those of the table above.
//! The lock server itself is not found here: `locksmith-lab bench --spawn
//! server` and `torture --spawn server` start the `locksmith` executable
//! (beside `locksmith-lab`, else on `PATH`) as `locksmith serve`.

#![deny(missing_docs)]

mod certs;
#[cfg(feature = "conformance")]
pub mod conformance;
mod error;
mod etcd;
mod etcd_cluster;
mod find;
mod fuzz_seeds;
pub mod netns;
pub mod pgbouncer;
mod ports;
mod postgres;
mod process;
#[cfg(feature = "proxy")]
pub mod proxy;
mod redis;
mod redis_cluster;
mod redis_sentinel;
mod resp;
mod settle;
mod spawner;
mod zookeeper;
mod zookeeper_ensemble;

use std::net::{Ipv4Addr, SocketAddr};

pub use certs::Certificates;
pub use error::{Error, Result};
pub use etcd::Etcd;
pub use etcd_cluster::EtcdCluster;
pub use find::{binary, try_binary};
pub use fuzz_seeds::fuzz_seeds;
pub use ports::free_port;
pub use postgres::Postgres;
pub use process::{Process, ProcessSpec, START_MARKER};
pub use redis::Redis;
pub use redis_cluster::RedisCluster;
pub use redis_sentinel::RedisSentinel;
pub use resp::RespValue;
pub use zookeeper::ZooKeeper;
pub use zookeeper_ensemble::ZooKeeperEnsemble;

/// The loopback address every server listens on.
pub const HOST: &str = "127.0.0.1";

/// `url` with one more query parameter (`key=value`), after `?` or `&`
/// as the URL needs: for the backend options the tests and the bench add to
/// a setup's URL.
pub fn with_query(url: &str, parameter: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{parameter}")
}

/// The operations every server handle offers, for code (the conformance suite,
/// the torture tool) that treats all backends alike.
///
/// The concrete types have the same methods inherently, so tests that use one
/// server type do not need to import this trait.
pub trait Server: Send + Sync {
    /// A short name of the server, like `"redis"`.
    fn name(&self) -> &'static str;
    /// The client port on `127.0.0.1`.
    fn port(&self) -> u16;
    /// The URL locksmith's client uses for this server, like `redis://127.0.0.1:6379`.
    fn url(&self) -> String;
    /// The underlying process, for signals, the pid and the log.
    fn process(&self) -> &Process;
    /// Stops the server if it runs and starts it again on the same port with the
    /// same data, waiting until it answers.
    fn try_restart(&self) -> Result<()>;

    /// Like [`Server::try_restart`], panicking on failure.
    #[track_caller]
    fn restart(&self) {
        crate::or_panic(self.try_restart())
    }
    /// Kills the server with `SIGKILL` (its whole process group) and reaps it.
    fn kill(&self) {
        self.process().kill();
    }
    /// Freezes the server with `SIGSTOP`: it keeps its sockets but answers nothing.
    fn pause(&self) {
        self.process().pause();
    }
    /// Undoes [`Server::pause`] with `SIGCONT`.
    fn resume(&self) {
        self.process().resume();
    }
    /// Whether the server process exists (a paused server counts as running).
    fn is_running(&self) -> bool {
        self.process().is_running()
    }
}

/// Implements the inherent fault methods and [`Server`] for a server type that
/// has `process: Process`, `fn port`, `fn url` and `fn try_restart`.
macro_rules! impl_server {
    ($ty:ty, $name:literal) => {
        impl $ty {
            /// Kills the server with `SIGKILL` (its whole process group) and reaps it;
            /// [`restart`](Self::restart) brings it back with the same data.
            pub fn kill(&self) {
                self.process.kill();
            }

            /// Freezes the server with `SIGSTOP` (its whole process group): connections
            /// stay open but nothing is answered, like a long GC pause or a stalled VM.
            pub fn pause(&self) {
                self.process.pause();
            }

            /// Undoes [`pause`](Self::pause) with `SIGCONT`.
            pub fn resume(&self) {
                self.process.resume();
            }

            /// Whether the server process exists (a paused server counts as running).
            pub fn is_running(&self) -> bool {
                self.process.is_running()
            }

            /// The pid of the server process, if it runs.
            pub fn pid(&self) -> Option<u32> {
                self.process.pid()
            }

            /// Stops the server if it runs and starts it again on the same port with
            /// the same data directory, waiting until it answers; panics on failure.
            #[track_caller]
            pub fn restart(&self) {
                $crate::or_panic(self.try_restart())
            }

            /// The server's temporary directory (data, config, log).
            pub fn dir(&self) -> &std::path::Path {
                self.dir.path()
            }

            /// The underlying process: signals, pid, log file.
            pub fn process(&self) -> &$crate::Process {
                &self.process
            }

            /// The last `lines` lines of the server's log (stdout and stderr).
            pub fn log_tail(&self, lines: usize) -> String {
                self.process.log_tail(lines)
            }
        }

        impl $crate::Server for $ty {
            fn name(&self) -> &'static str {
                $name
            }
            fn port(&self) -> u16 {
                <$ty>::port(self)
            }
            fn url(&self) -> String {
                <$ty>::url(self)
            }
            fn process(&self) -> &$crate::Process {
                &self.process
            }
            fn try_restart(&self) -> $crate::Result<()> {
                <$ty>::try_restart(self)
            }
        }
    };
}
pub(crate) use impl_server;

/// The file in each server directory naming the pid of the test process that
/// owns it.
const OWNER_FILE: &str = ".locksmith-owner";

/// Creates the temporary directory of one server, named after it.
///
/// The directory records its owner's pid, and the first call in a process
/// removes the directories of owners that are gone: a test process killed with
/// `SIGKILL` takes its servers with it (`PR_SET_PDEATHSIG`) but cannot clean up
/// their directories.
pub(crate) fn server_dir(name: &str) -> Result<tempfile::TempDir> {
    static SWEEP: std::sync::Once = std::sync::Once::new();
    SWEEP.call_once(sweep_orphaned_dirs);
    let dir = tempfile::Builder::new()
        .prefix(&format!("locksmith-{name}-"))
        .tempdir()
        .map_err(|e| Error::io(format!("cannot create a temporary directory for {name}"), e))?;
    let owner = dir.path().join(OWNER_FILE);
    std::fs::write(&owner, std::process::id().to_string())
        .map_err(|e| Error::io(format!("cannot write {}", owner.display()), e))?;
    Ok(dir)
}

/// Removes the server directories whose owning process no longer exists,
/// and PostgreSQL's `initdb` templates of two days ago or more.
fn sweep_orphaned_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        // Every server's directory, whatever the server: a kind left out of a
        // list here (PgBouncer was) would pile up a directory per test run.
        let name = entry.file_name();
        let name = name.to_str().unwrap_or_default();
        let is_ours = name.starts_with("locksmith-");
        let age = entry
            .metadata()
            .ok()
            .and_then(|m| m.modified().ok()?.elapsed().ok());
        if age.is_some_and(|age| postgres::is_stale_template(name, age)) {
            tracing::debug!(dir = %path.display(), "removing an old initdb template");
            let _ = std::fs::remove_dir_all(&path);
            continue;
        }
        let owner = std::fs::read_to_string(path.join(OWNER_FILE))
            .ok()
            .and_then(|pid| pid.trim().parse::<i32>().ok());
        if let (true, Some(pid)) = (is_ours, owner) {
            // SAFETY: signal 0 only checks whether the pid exists.
            let gone = unsafe { libc::kill(pid, 0) } != 0
                && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
            if gone && pid > 0 {
                tracing::debug!(dir = %path.display(), pid, "removing an orphaned server directory");
                let _ = std::fs::remove_dir_all(&path);
            }
        }
    }
}

/// Unwraps `result`, panicking with the error's message at the caller's location.
#[track_caller]
pub(crate) fn or_panic<T>(result: Result<T>) -> T {
    match result {
        Ok(value) => value,
        Err(e) => panic!("{e}"),
    }
}

/// `127.0.0.1:port`.
pub(crate) fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

/// How many times a `start` tries a fresh port when the chosen one was taken.
pub(crate) const PORT_ATTEMPTS: usize = 3;

/// Runs `start` up to [`PORT_ATTEMPTS`] times while it fails because its port
/// was taken by someone else in the meantime.
pub(crate) fn retry_on_port_clash<T>(mut start: impl FnMut() -> Result<T>) -> Result<T> {
    let mut attempt = 1;
    loop {
        match start() {
            Err(e) if attempt < PORT_ATTEMPTS && e.is_address_in_use() => {
                tracing::debug!(error = %e, "port taken, retrying with another one");
                attempt += 1;
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::with_query;

    #[test]
    fn a_query_parameter_goes_after_a_question_mark_or_an_ampersand() {
        assert_eq!(
            with_query("redis+cluster://a:1,b:2", "wait_timeout=5s"),
            "redis+cluster://a:1,b:2?wait_timeout=5s"
        );
        assert_eq!(
            with_query("rediss+cluster://a:1?tls_ca=/ca.pem", "wait_replicas=0"),
            "rediss+cluster://a:1?tls_ca=/ca.pem&wait_replicas=0"
        );
    }
}
