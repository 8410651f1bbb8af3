//! [`Environment`]: what the server takes from the machine it runs on,
//! beyond its config: the wall clock, where connections come from, how it
//! reaches the other members, and (in a simulation) the disk's write-back
//! cache its Raft log is written through ([`WriteCache`]). [`Server::start`](crate::Server::start) uses
//! the machine's; a deterministic simulation (crate `locksmith-sim`) gives
//! its own, with [`crate::Execution::Tasks`] in the config, and so runs the
//! same server on simulated hosts, network and time.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::SystemTime;

use locksmith_proto::transport::{Connector, Io};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::clock::WallClock;

/// A connection being accepted, and its peer's address.
pub type Accepting<'a> =
    Pin<Box<dyn Future<Output = io::Result<(Box<dyn Io>, SocketAddr)>> + Send + 'a>>;

/// Where the server accepts connections when not on a TCP port of the
/// machine's (a simulated network's listener, bound by its owner).
pub trait Listener: Send + 'static {
    /// The next connection and its peer's address.
    ///
    /// Cancel safety: must be cancel safe (the accept loop selects on it):
    /// a dropped call accepts nothing.
    fn accept(&mut self) -> Accepting<'_>;
}

/// A sync of the Raft log's writer under way on a [`WriteCache`].
pub type Syncing = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A disk's write-back cache as a simulation keeps it, for the Raft log's
/// writer (the one writer whose data is acknowledged as durable while the
/// server runs): told of each write of a log segment before it is made and
/// of each `fdatasync` after it returns, so that a simulated power loss can
/// drop or tear what was written after the last sync, as a real one does;
/// and waited for before each commit's sync, which is how long the
/// simulated disk takes (a slow disk). Without one (the machine's), a
/// commit is written and synced in one step, as before.
///
/// Only the log segments' data goes through it: a segment's creation, the
/// manifest and the snapshot and token files are written and synced in one
/// step each (their directory entries synced with them), so that a crash
/// never lands between their write and their sync.
pub trait WriteCache: Send + Sync + 'static {
    /// `len` bytes are about to be written at `offset` of `path` (which may
    /// be shorter than `offset + len`).
    fn writing(&self, path: &Path, offset: u64, len: u64);
    /// `path`'s data was synced (`fdatasync` returned): what was written to
    /// it is durable.
    fn synced(&self, path: &Path);
    /// The time the disk takes for the sync of a commit, waited for after
    /// the commit is written and before it is synced. The writer tells
    /// nobody the commit is durable before the sync.
    fn sync(&self) -> Syncing;
}

/// How long a simulated member takes to apply what Raft committed (its
/// CPU busy with other work, a long pause of its process): waited for
/// before each run of committed entries is handed to the core, so that
/// openraft counts them applied, and the core answers their clients, that
/// much later. Without one (the machine's), applying takes what it takes.
pub trait ApplyPace: Send + Sync + 'static {
    /// The time applying the next run of committed entries takes.
    fn applying(&self) -> Syncing;
}

/// What the server takes from the machine it runs on.
pub struct Environment {
    pub(crate) wall_clock: WallClock,
    pub(crate) listener: Option<Box<dyn Listener>>,
    pub(crate) connector: Option<Connector>,
    pub(crate) write_cache: Option<Arc<dyn WriteCache>>,
    pub(crate) apply_pace: Option<Arc<dyn ApplyPace>>,
}

impl Environment {
    /// The machine's: its wall clock, a TCP listener on
    /// [`crate::ServerConfig::listen`], TCP to the other members.
    pub fn machine() -> Environment {
        Environment {
            wall_clock: SystemTime::now,
            listener: None,
            connector: None,
            write_cache: None,
            apply_pace: None,
        }
    }

    /// Reads the wall clock from `wall` (the engine's time starts there and
    /// then follows tokio's clock, see module `clock`).
    pub fn wall_clock(mut self, wall: WallClock) -> Environment {
        self.wall_clock = wall;
        self
    }

    /// Accepts client and member connections from `listener` instead of
    /// binding [`crate::ServerConfig::listen`], which is then only the
    /// address the server reports as its own. Plaintext only: with TLS in the
    /// config the server refuses to start.
    pub fn listener(mut self, listener: impl Listener) -> Environment {
        self.listener = Some(Box::new(listener));
        self
    }

    /// Reaches the other members through `connector` instead of TCP.
    pub fn connector(mut self, connector: Connector) -> Environment {
        self.connector = Some(connector);
        self
    }

    /// Writes the Raft log through `cache` (a simulated disk's): each
    /// commit is written, then the writer waits for [`WriteCache::sync`]
    /// before it syncs and tells anyone. Only with
    /// [`crate::Execution::Tasks`]; a writer on a thread of its own tells
    /// the cache of its writes and syncs but does not wait.
    pub fn write_cache(mut self, cache: Arc<dyn WriteCache>) -> Environment {
        self.write_cache = Some(cache);
        self
    }

    /// Waits for `pace` ([`ApplyPace::applying`]) before each run of
    /// committed entries is applied (a simulation's busy member).
    pub fn apply_pace(mut self, pace: Arc<dyn ApplyPace>) -> Environment {
        self.apply_pace = Some(pace);
        self
    }
}

impl Default for Environment {
    fn default() -> Environment {
        Environment::machine()
    }
}

impl fmt::Debug for Environment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Environment")
            .field("listener", &self.listener.is_some())
            .field("connector", &self.connector)
            .field("write_cache", &self.write_cache.is_some())
            .field("apply_pace", &self.apply_pace.is_some())
            .finish_non_exhaustive()
    }
}

/// A connection from a [`Listener`], with its peer's address for the
/// service (sessions per client address), as tonic reads it from a TCP one.
pub(crate) struct Accepted {
    io: Box<dyn Io>,
    peer: SocketAddr,
}

impl Accepted {
    pub(crate) fn new(io: Box<dyn Io>, peer: SocketAddr) -> Accepted {
        Accepted { io, peer }
    }
}

impl Connected for Accepted {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        TcpConnectInfo {
            local_addr: None,
            remote_addr: Some(self.peer),
        }
    }
}

impl AsyncRead for Accepted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Accepted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
