//! Options and helpers shared by the subcommands that use a lock.

use std::process::ExitCode;
use std::time::Duration;

use locksmith::{Client, ConnectOptions, Lock};

/// Where the locks live.
#[derive(Debug, Clone, clap::Args)]
pub struct BackendArgs {
    /// Lock store URL: locksmith://, locksmith+tls://, redis://, redis+redlock://, zk://, etcd://,
    /// postgres://, memory://
    #[arg(
        long,
        env = "LOCKSMITH_BACKEND",
        default_value = "locksmith://127.0.0.1:7420"
    )]
    pub backend: String,
    /// Session TTL: how long holds outlive this process if it dies or hangs.
    #[arg(long, value_parser = parse_duration, default_value = "15s")]
    pub session_ttl: Duration,
}

impl BackendArgs {
    /// Connects, naming this client after the subcommand.
    ///
    /// Cancel safety: safe, as `Client::connect_with`.
    pub async fn connect(&self, what: &str) -> Result<Client, ExitCode> {
        let options = ConnectOptions::default()
            .session_ttl(self.session_ttl)
            .client_name(format!("locksmith {what}[{}]", std::process::id()));
        Client::connect_with(&self.backend, options)
            .await
            .map_err(|error| fail(&error))
    }
}

/// How to hold the lock.
#[derive(Debug, Clone, clap::Args)]
pub struct LockArgs {
    /// Lock name, such as `jobs/nightly-report`.
    pub name: String,
    /// Hold the shared (reader) side of a read-write lock.
    #[arg(long, conflicts_with = "semaphore")]
    pub shared: bool,
    /// Hold one of N permits of a semaphore.
    #[arg(long, value_name = "N")]
    pub semaphore: Option<u32>,
    /// Fixed lease (no watchdog): the hold ends after it, e.g. `30s`.
    #[arg(long, value_parser = parse_duration)]
    pub lease: Option<Duration>,
    /// Owner id (defaults to a fresh one).
    #[arg(long)]
    pub owner: Option<String>,
    /// Wait at most this long, e.g. `500ms`, `30s`, `5m` (default: forever).
    #[arg(long, value_parser = parse_duration, conflicts_with = "no_wait")]
    pub wait: Option<Duration>,
    /// Fail at once if the lock is held.
    #[arg(long)]
    pub no_wait: bool,
}

impl LockArgs {
    /// The lock these options describe.
    pub fn lock(&self, client: &Client) -> Lock {
        let mut lock = match (self.shared, self.semaphore) {
            (true, _) => client.rw_lock(self.name.as_str()).read(),
            (_, Some(permits)) => client.semaphore(self.name.as_str(), permits),
            _ => client.lock(self.name.as_str()),
        };
        if let Some(lease) = self.lease {
            lock = lock.lease(lease);
        }
        if let Some(owner) = &self.owner {
            lock = lock.owner(owner.as_str());
        }
        lock
    }

    /// Acquires as the wait options say: `Ok(None)` when the lock stayed busy.
    ///
    /// Cancel safety: safe, as `Lock::acquire`: a dropped call leaves no
    /// queue entry and no hold behind.
    pub async fn acquire(&self, client: &Client) -> locksmith::Result<Option<locksmith::Guard>> {
        let lock = self.lock(client);
        match (self.no_wait, self.wait) {
            (true, _) => lock.try_acquire().await,
            (_, Some(wait)) => match lock.acquire_timeout(wait).await {
                Err(locksmith::Error::Timeout(_)) => Ok(None),
                other => other.map(Some),
            },
            _ => lock.acquire().await.map(Some),
        }
    }
}

/// Parses `500ms`, `30s`, `5m`, `1h30m`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("{e} (use e.g. 500ms, 30s, 5m)"))
}

/// Prints an error and gives the generic failure status.
pub fn fail(error: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("locksmith: {error}");
    ExitCode::FAILURE
}

/// SIGINT and SIGTERM, listened for from the moment it is made.
///
/// Make it first thing in a command, before it prints what a signal may
/// follow (a fencing token, "listening"): tokio tells a signal only to the
/// listeners that existed when it arrived, and once any listener exists the
/// signal no longer ends the process by itself. A listener made per wait
/// would miss a signal that lands between two waits, and the command would
/// run on as if never told to stop.
pub struct Termination {
    /// `None` when the handlers could not be installed: never completes.
    signals: Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>,
}

impl Termination {
    /// Starts listening. Needs the tokio runtime.
    pub fn listen() -> Self {
        use tokio::signal::unix::{signal, SignalKind};
        let signals = match (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) {
            (Ok(interrupt), Ok(terminate)) => Some((interrupt, terminate)),
            _ => None,
        };
        Self { signals }
    }

    /// Completes on the next SIGINT or SIGTERM, with the signal; one that
    /// arrived since the last call completes it at once.
    ///
    /// Cancel safety: safe; a signal that arrives while no call waits is kept
    /// for the next call.
    pub async fn recv(&mut self) -> nix::sys::signal::Signal {
        let Some((interrupt, terminate)) = &mut self.signals else {
            return std::future::pending().await;
        };
        tokio::select! {
            _ = interrupt.recv() => nix::sys::signal::Signal::SIGINT,
            _ = terminate.recv() => nix::sys::signal::Signal::SIGTERM,
        }
    }
}
