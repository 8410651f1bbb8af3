//! The one error type of the testkit.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

/// A `Result` with the testkit's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a server could not be found, started or driven.
///
/// Every variant's message is meant to be read in a failed test's output: it says
/// what was run and, for servers, ends with the tail of the server's log.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A binary (or the ZooKeeper jar) is not installed.
    #[error(
        "{name} not found {looked_in}: install it with `apt-get install {package}`, \
         or run scripts/test which does"
    )]
    NotInstalled {
        /// The binary or file that is missing, like `redis-server`.
        name: String,
        /// Where it was looked for, like `on PATH`.
        looked_in: String,
        /// The Debian package that installs it, like `redis-server`.
        package: String,
    },

    /// An operating-system call failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: io::Error,
    },

    /// A one-shot helper command (`initdb`, `useradd`, ...) failed.
    #[error("`{command}` failed ({status}):\n{output}")]
    Command {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// Its stdout and stderr.
        output: String,
    },

    /// The server process exited while it was starting.
    #[error("{server} exited while starting ({status}); last lines of {log}:\n{tail}")]
    Exited {
        /// Which server, like `redis-server on port 6379`.
        server: String,
        /// Its exit status.
        status: String,
        /// Its log file.
        log: PathBuf,
        /// The end of its log.
        tail: String,
    },

    /// The server did not answer its protocol in time.
    #[error(
        "{server} not ready after {timeout:?} (last probe: {last_probe}); last lines of {log}:\n{tail}"
    )]
    NotReady {
        /// Which server, like `redis-server on port 6379`.
        server: String,
        /// How long it was given.
        timeout: Duration,
        /// What the last readiness probe saw.
        last_probe: String,
        /// Its log file.
        log: PathBuf,
        /// The end of its log.
        tail: String,
    },

    /// A replicated setup (a Sentinel group, a Redis Cluster, an etcd cluster,
    /// a ZooKeeper ensemble) did not reach the state asked for in time.
    #[error("{setup}: not {state} after {timeout:?} (last check: {last_check}){logs}")]
    NotSettled {
        /// Which setup, like `Redis Cluster on ports 7000, 7001, …`.
        setup: String,
        /// The state waited for, like `healthy`.
        state: String,
        /// How long it was given.
        timeout: Duration,
        /// What the last check saw.
        last_check: String,
        /// The end of every member's log, each headed by its file name.
        logs: String,
    },
}

impl Error {
    /// Wraps an [`io::Error`] with what was being done.
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// Whether the server failed because its port was taken (so a retry on
    /// another port may succeed).
    pub(crate) fn is_address_in_use(&self) -> bool {
        match self {
            Error::Exited { tail, .. } | Error::NotReady { tail, .. } => {
                let tail = tail.to_ascii_lowercase();
                tail.contains("address already in use") || tail.contains("address in use")
            }
            _ => false,
        }
    }
}
