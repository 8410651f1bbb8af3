//! [`Connector`]: how a gRPC channel to a member reaches its address, when
//! not over the machine's TCP: a deterministic simulation hands the client
//! library and the server's members one that dials its simulated network.
//! [`dial`]: a connection of the framed streams' own, the same way.

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tonic::transport::{Channel, Endpoint, Uri};

/// A byte stream a [`Connector`] opens (or a listener accepts).
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

/// A stream being opened.
type Dialing = Pin<Box<dyn Future<Output = io::Result<Box<dyn Io>>> + Send>>;

/// Opens the byte stream under a gRPC channel to `host:port`, in place of a
/// TCP connection (tonic's `Endpoint::connect_with_connector`). Cloning is
/// cheap: every clone dials the same way.
#[derive(Clone)]
pub struct Connector {
    dial: Arc<dyn Fn(String) -> Dialing + Send + Sync>,
}

impl Connector {
    /// A connector that opens a stream to `host:port` with `dial`.
    pub fn new<F, Fut, S>(dial: F) -> Connector
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = io::Result<S>> + Send + 'static,
        S: Io,
    {
        Connector {
            dial: Arc::new(move |addr| {
                let dialing = dial(addr);
                Box::pin(async move { Ok(Box::new(dialing.await?) as Box<dyn Io>) })
            }),
        }
    }
}

/// A channel to `endpoint`, connected on first use: over TCP, or through
/// `connector` when given.
pub fn channel(endpoint: Endpoint, connector: Option<&Connector>) -> Channel {
    match connector {
        Some(connector) => connector
            .prepare(endpoint)
            .connect_with_connector_lazy(connector.clone()),
        None => endpoint.connect_lazy(),
    }
}

/// A channel to `endpoint`, connected now: over TCP, or through `connector`
/// when given.
///
/// Cancel safety: safe; a dropped connect leaves nothing behind.
pub async fn connect(
    endpoint: Endpoint,
    connector: Option<&Connector>,
) -> Result<Channel, tonic::transport::Error> {
    match connector {
        Some(connector) => {
            let endpoint = connector.prepare(endpoint);
            endpoint.connect_with_connector(connector.clone()).await
        }
        None => endpoint.connect().await,
    }
}

impl Connector {
    /// Opens a stream to `addr` (`host:port`).
    ///
    /// Cancel safety: safe; a dropped dial leaves nothing behind.
    pub async fn dial(&self, addr: &str) -> io::Result<Box<dyn Io>> {
        (self.dial)(addr.to_owned()).await
    }

    /// How long HTTP/2 remembers a stream it reset through a connector, to
    /// ignore the frames still on their way for it. h2 counts that while in
    /// real time (`std::time::Instant`, not tokio's clock), and on a
    /// simulated network a run takes more or less real time as the machine
    /// is faster or slower, so a frame held back with a frozen member would
    /// be ignored in one run and answered with a reset in its replay.
    /// Remembered for a day instead, longer than any run; how many are
    /// remembered at once stays bounded (h2's count, 50).
    pub const RESET_STREAM_MEMORY: Duration = Duration::from_secs(24 * 3600);

    /// `endpoint` as a channel through a connector needs it
    /// ([`Connector::RESET_STREAM_MEMORY`]).
    fn prepare(&self, endpoint: Endpoint) -> Endpoint {
        endpoint.http2_reset_stream_duration(Self::RESET_STREAM_MEMORY)
    }
}

/// A stream to `addr` (`host:port`): through `connector` when given, else
/// over TCP (without Nagle's delay); over TLS with `tls` when given, the
/// host part checked against the server's certificate.
///
/// Cancel safety: safe; a dropped dial closes what it opened.
pub async fn dial(
    addr: &str,
    tls: Option<Arc<rustls::ClientConfig>>,
    connector: Option<&Connector>,
) -> io::Result<Box<dyn Io>> {
    let io: Box<dyn Io> = match connector {
        Some(connector) => connector.dial(addr).await?,
        None => {
            let tcp = tokio::net::TcpStream::connect(addr).await?;
            tcp.set_nodelay(true)?;
            Box::new(tcp)
        }
    };
    let Some(config) = tls else {
        return Ok(io);
    };
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = rustls::pki_types::ServerName::try_from(host.to_owned())
        .map_err(|error| io::Error::new(io::ErrorKind::InvalidInput, error))?;
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, io)
        .await?;
    Ok(Box::new(tls))
}

/// Two connectors are equal when they are clones of one.
impl PartialEq for Connector {
    fn eq(&self, other: &Connector) -> bool {
        Arc::ptr_eq(&self.dial, &other.dial)
    }
}

impl Eq for Connector {}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Connector")
    }
}

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<Box<dyn Io>>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let Some(authority) = uri.authority() else {
            let error = io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("no host:port in {uri}"),
            );
            return Box::pin(std::future::ready(Err(error)));
        };
        let dialing = (self.dial)(authority.to_string());
        Box::pin(async move { Ok(TokioIo::new(dialing.await?)) })
    }
}
