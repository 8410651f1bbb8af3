//! [`Environment`]: what the server takes from the machine it runs on,
//! beyond its config: the wall clock, where connections come from, how it
//! reaches the other members. [`Server::start`](crate::Server::start) uses
//! the machine's; a deterministic simulation (crate `locksmith-sim`) gives
//! its own, with [`crate::Execution::Tasks`] in the config, and so runs the
//! same server on simulated hosts, network and time.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
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

/// What the server takes from the machine it runs on.
pub struct Environment {
    pub(crate) wall_clock: WallClock,
    pub(crate) listener: Option<Box<dyn Listener>>,
    pub(crate) connector: Option<Connector>,
}

impl Environment {
    /// The machine's: its wall clock, a TCP listener on
    /// [`crate::ServerConfig::listen`], TCP to the other members.
    pub fn machine() -> Environment {
        Environment {
            wall_clock: SystemTime::now,
            listener: None,
            connector: None,
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
