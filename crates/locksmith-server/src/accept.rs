//! The accept loop: which TCP connections reach the gRPC server.
//!
//! tonic's own `TcpIncoming` accepts everything at once and hands it to
//! HTTP/2. That leaves three holes a careless or hostile client can use, so
//! connections come through [`incoming`] instead:
//!
//! - **Connection limit** ([`ServerConfig::max_connections`]): a connection
//!   past the limit is closed as soon as it is accepted (and logged), so file
//!   descriptors and memory stay bounded and the client learns at once
//!   instead of waiting for a handshake that never comes.
//! - **Handshake timeout** ([`ServerConfig::handshake_timeout`]): a
//!   connection must send the whole HTTP/2 client preface (the fixed string
//!   and its SETTINGS frame) within this time, or it is closed. hyper waits
//!   for the preface forever, and its keep-alive pings only start after it.
//!   A connection whose first bytes are not the preface's (an HTTP/1
//!   request, noise) is closed at once.
//!   Once a connection is up, HTTP/2 keep-alive closes it if it stops
//!   answering.
//! - **Back-off when out of file descriptors**: `accept` failing with
//!   EMFILE/ENFILE (or ENOBUFS/ENOMEM) leaves the connection in the backlog,
//!   so retrying at once fails again at once: tonic's loop spun at full CPU
//!   without a word. Here the loop waits (10 ms, doubling to 1 s) and logs
//!   the condition once per episode, and once more when it recovers.
//!
//! - **TLS** (module `tls`): with TLS on, the TLS handshake comes first,
//!   within the same handshake timeout, and the preface is read inside it. A
//!   plaintext client fails the TLS handshake and is closed.
//!
//! The bytes of the preface read here are handed on to hyper unchanged
//! ([`Connection`] replays them), so HTTP/2 sees the connection from its
//! first byte.
//!
//! A connection that starts with a framed stream's magic instead of the
//! preface goes to the handler [`incoming`] is given for it
//! ([`FramedHandlers`]), with what it sent after the magic replayed the
//! same way: a client's session stream (`locksmith_proto::framed::MAGIC`,
//! module `framed_session`) or a member's replication stream
//! (`APPEND_MAGIC`, module `raft::append_stream`). It has sent the magic
//! within the handshake timeout; the handler bounds what follows.
//!
//! [`ServerConfig::max_connections`]: crate::ServerConfig::max_connections
//! [`ServerConfig::handshake_timeout`]: crate::ServerConfig::handshake_timeout

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::Stream;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::transport::server::Connected;

use crate::environment::Listener;
use locksmith_proto::framed::{APPEND_MAGIC, MAGIC};

/// The fixed start of every HTTP/2 connection (RFC 9113, section 3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// An HTTP/2 frame header: 3 bytes of length, type, flags, stream id.
const FRAME_HEADER: usize = 9;
const SETTINGS: u8 = 0x4;
/// A client's first SETTINGS frame is a few dozen bytes; HTTP/2's smallest
/// maximum frame size bounds it.
const MAX_SETTINGS_LEN: usize = 16_384;
/// First and longest wait after `accept` ran out of resources.
const FIRST_BACKOFF: Duration = Duration::from_millis(10);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// At most one warning per this interval about refused connections.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// What the accept loop enforces.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AcceptLimits {
    /// Most connections open at once (including those still handshaking).
    pub max_connections: usize,
    /// How long a connection may take to send its HTTP/2 client preface.
    pub handshake_timeout: Duration,
}

/// Where connections come from: the machine's TCP listener, or a listener
/// the server was given ([`crate::Listener`], a simulated network's).
pub(crate) trait Accept: Send + 'static {
    /// The connection accepted.
    type Stream: Send + 'static;

    /// The next connection and its peer's address.
    fn accept(&mut self) -> impl Future<Output = io::Result<(Self::Stream, SocketAddr)>> + Send;
}

impl Accept for TcpListener {
    type Stream = TcpStream;

    async fn accept(&mut self) -> io::Result<(TcpStream, SocketAddr)> {
        let (stream, peer) = TcpListener::accept(self).await?;
        let _ = stream.set_nodelay(true);
        Ok((stream, peer))
    }
}

impl Accept for Box<dyn Listener> {
    type Stream = crate::environment::Accepted;

    async fn accept(&mut self) -> io::Result<(Self::Stream, SocketAddr)> {
        let (io, peer) = Listener::accept(self.as_mut()).await?;
        Ok((crate::environment::Accepted::new(io, peer), peer))
    }
}

/// What becomes of a framed connection of one kind.
pub(crate) type FramedHandler<S> = Arc<dyn Fn(Connection<S>) + Send + Sync>;

/// The handlers of the framed streams, by their magic.
pub(crate) struct FramedHandlers<S> {
    /// A client's session stream.
    pub session: FramedHandler<S>,
    /// A member's replication stream.
    pub append: FramedHandler<S>,
}

impl<S> Clone for FramedHandlers<S> {
    fn clone(&self) -> Self {
        FramedHandlers {
            session: self.session.clone(),
            append: self.append.clone(),
        }
    }
}

/// The framed streams, each told by its magic.
#[derive(Debug, Clone, Copy, PartialEq)]
enum FramedStream {
    Session,
    Append,
}

impl FramedStream {
    const ALL: [(FramedStream, &'static [u8; 12]); 2] = [
        (FramedStream::Session, MAGIC),
        (FramedStream::Append, APPEND_MAGIC),
    ];
}

/// Accepts connections from `listener` until the returned stream is dropped,
/// yielding each once `upgrade` (nothing, or the TLS handshake) is done and
/// it has sent its HTTP/2 preface, both in time; a connection that sends a
/// framed stream's magic instead goes to that stream's handler in `framed`.
///
/// Must be called within a tokio runtime: the loop runs as its own task (and
/// each handshake as one), so a slow client never holds up the next accept.
/// That task is returned too: it ends, and closes the listener, soon after
/// the stream is dropped, and a server that stops waits for it, so that its
/// address is free once it has stopped.
pub(crate) fn incoming<L, S, U, F>(
    listener: L,
    limits: AcceptLimits,
    upgrade: U,
    framed: FramedHandlers<S>,
) -> (
    impl Stream<Item = Result<Connection<S>, io::Error>>,
    JoinHandle<()>,
)
where
    L: Accept,
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    U: Fn(L::Stream) -> F + Send + 'static,
    F: Future<Output = io::Result<S>> + Send + 'static,
{
    let (ready, receiver) = mpsc::channel(64);
    let accepting = tokio::spawn(accept_loop(listener, limits, upgrade, framed, ready));
    (ReceiverStream::new(receiver).map(Ok), accepting)
}

/// The loop behind [`incoming`]; ends when the server stops taking
/// connections (the receiver is dropped).
///
/// Cancel safety: runs as its own task; dropping it closes the listener.
async fn accept_loop<L, S, U, F>(
    mut listener: L,
    limits: AcceptLimits,
    upgrade: U,
    framed: FramedHandlers<S>,
    ready: mpsc::Sender<Connection<S>>,
) where
    L: Accept,
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    U: Fn(L::Stream) -> F,
    F: Future<Output = io::Result<S>> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut backoff: Option<(Duration, u64)> = None;
    let mut refused = Throttled::default();
    loop {
        let accepted = tokio::select! {
            _ = ready.closed() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                if let Some((_, failures)) = backoff.take() {
                    tracing::info!(failures, "accepting connections again");
                }
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    refused.warn(|suppressed| {
                        tracing::warn!(
                            %peer,
                            limit = limits.max_connections,
                            refused_since_last_warning = suppressed,
                            "limit reached: connections; closing the new connection"
                        )
                    });
                    continue; // dropping the stream closes it
                };
                tokio::spawn(handshake(
                    upgrade(stream),
                    peer,
                    slot,
                    limits.handshake_timeout,
                    ready.clone(),
                    framed.clone(),
                ));
            }
            Err(error) if out_of_resources(&error) => {
                let (delay, failures) = match backoff {
                    None => {
                        tracing::warn!(
                            %error,
                            "cannot accept connections (out of file descriptors or memory); \
                             backing off until some close (raise `ulimit -n` or lower \
                             max_connections)"
                        );
                        (FIRST_BACKOFF, 1)
                    }
                    Some((delay, failures)) => ((delay * 2).min(MAX_BACKOFF), failures + 1),
                };
                backoff = Some((delay, failures));
                tokio::select! {
                    _ = ready.closed() => return,
                    _ = tokio::time::sleep(delay) => {}
                }
            }
            // The connection went away before it was accepted (ECONNABORTED
            // and the like): nothing to do.
            Err(error) => tracing::debug!(%error, "accept failed"),
        }
    }
}

/// Whether `accept` failed for want of resources, which retrying at once
/// cannot fix.
fn out_of_resources(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Upgrades the connection and reads the client preface within `timeout`,
/// then hands the connection on: to tonic, or to a handler of `framed`.
///
/// Cancel safety: runs as its own task.
async fn handshake<S: AsyncRead + Unpin>(
    upgraded: impl Future<Output = io::Result<S>>,
    peer: SocketAddr,
    slot: OwnedSemaphorePermit,
    timeout: Duration,
    ready: mpsc::Sender<Connection<S>>,
    framed: FramedHandlers<S>,
) {
    let upgraded_and_opening = async {
        let mut stream = upgraded.await?;
        let opening = read_opening(&mut stream).await?;
        Ok::<_, io::Error>((stream, opening))
    };
    match tokio::time::timeout(timeout, upgraded_and_opening).await {
        Ok(Ok((stream, opening))) => {
            let (preface, handler) = match opening {
                Opening::Http2(preface) => (preface, None),
                Opening::Framed(FramedStream::Session, after) => (after, Some(&framed.session)),
                Opening::Framed(FramedStream::Append, after) => (after, Some(&framed.append)),
            };
            let connection = Connection {
                stream,
                preface,
                replayed: 0,
                _slot: slot,
            };
            match handler {
                Some(handler) => handler(connection),
                None => {
                    let _ = ready.send(connection).await;
                }
            }
        }
        Ok(Err(error)) => {
            tracing::debug!(%peer, %error, "no TLS or HTTP/2 handshake; closed")
        }
        Err(_) => tracing::debug!(%peer, ?timeout, "no HTTP/2 handshake in time; closed"),
    }
}

/// How a connection opened.
#[derive(Debug, PartialEq)]
enum Opening {
    /// With the HTTP/2 client preface: its bytes, read whole.
    Http2(Vec<u8>),
    /// With a framed stream's magic: which stream, and the bytes read
    /// after the magic (the start of its first frame).
    Framed(FramedStream, Vec<u8>),
}

/// Reads the HTTP/2 client preface (the fixed string and a SETTINGS frame),
/// or a framed stream's magic.
///
/// Both are checked as their bytes arrive, so a client speaking something
/// else is refused at its first wrong byte. An HTTP/1 request can be
/// shorter than the preface and then waits for an answer: read whole first,
/// it would be held until the handshake timeout.
///
/// Cancel safety: not safe: bytes already read are lost with the future, so
/// the stream is no use after; its caller drops the connection with it (on
/// the handshake timeout).
async fn read_opening(stream: &mut (impl AsyncRead + Unpin)) -> io::Result<Opening> {
    let not_http2 = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "the connection starts with neither the HTTP/2 client preface nor a framed magic",
        )
    };
    let starts_as = |bytes: &[u8], fixed: &[u8]| {
        let compared = bytes.len().min(fixed.len());
        bytes[..compared] == fixed[..compared]
    };
    let mut bytes = vec![0; PREFACE.len() + FRAME_HEADER];
    let mut filled = 0;
    while filled < bytes.len() {
        let read = stream.read(&mut bytes[filled..]).await?;
        if read == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        filled += read;
        let read = &bytes[..filled];
        let framed = FramedStream::ALL
            .iter()
            .find(|(_, magic)| starts_as(read, &magic[..]));
        match framed {
            Some(&(stream, magic)) if filled >= magic.len() => {
                return Ok(Opening::Framed(stream, read[magic.len()..].to_vec()));
            }
            Some(_) => {}
            None if starts_as(read, PREFACE) => {}
            None => return Err(not_http2()),
        }
    }
    let header = &bytes[PREFACE.len()..];
    let len = usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
    if header[3] != SETTINGS || len > MAX_SETTINGS_LEN {
        return Err(not_http2());
    }
    let start = bytes.len();
    bytes.resize(start + len, 0);
    stream.read_exact(&mut bytes[start..]).await?;
    Ok(Opening::Http2(bytes))
}

/// An accepted connection: its preface (already read) comes first, then the
/// socket. Holds a place under the connection limit until dropped.
pub(crate) struct Connection<S> {
    stream: S,
    preface: Vec<u8>,
    replayed: usize,
    _slot: OwnedSemaphorePermit,
}

impl<S: Connected> Connected for Connection<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> S::ConnectInfo {
        self.stream.connect_info()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Connection<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.replayed < this.preface.len() {
            let rest = &this.preface[this.replayed..];
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            this.replayed += n;
            if this.replayed == this.preface.len() {
                this.preface = Vec::new();
                this.replayed = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Connection<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// A warning repeated at most every [`WARN_EVERY`], with a count of what it
/// left out.
#[derive(Default)]
struct Throttled {
    last: Option<Instant>,
    suppressed: u64,
}

impl Throttled {
    fn warn(&mut self, log: impl FnOnce(u64)) {
        if self.last.is_some_and(|last| last.elapsed() < WARN_EVERY) {
            self.suppressed += 1;
            return;
        }
        log(self.suppressed);
        self.last = Some(Instant::now());
        self.suppressed = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        (client, server)
    }

    fn client_preface(settings: &[u8]) -> Vec<u8> {
        let mut bytes = PREFACE.to_vec();
        let len = settings.len();
        bytes.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, SETTINGS, 0]);
        bytes.extend_from_slice(&[0, 0, 0, 0]);
        bytes.extend_from_slice(settings);
        bytes
    }

    #[tokio::test]
    async fn the_preface_is_read_whole_and_replayed() {
        let (mut client, mut server) = pair().await;
        let mut sent = client_preface(&[0, 3, 0, 0, 0, 100]);
        sent.extend_from_slice(b"after");
        client.write_all(&sent).await.unwrap();
        let Opening::Http2(preface) = read_opening(&mut server).await.unwrap() else {
            panic!("an HTTP/2 connection");
        };
        assert_eq!(preface, sent[..sent.len() - 5]);
        let permit = Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap();
        let mut connection = Connection {
            stream: server,
            preface,
            replayed: 0,
            _slot: permit,
        };
        let mut got = vec![0; sent.len()];
        connection.read_exact(&mut got).await.unwrap();
        assert_eq!(got, sent);
    }

    #[tokio::test]
    async fn anything_else_is_refused() {
        for garbage in [
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n\r\n\r\n\r\n".to_vec(),
            // The preface, then a frame that is not SETTINGS.
            {
                let mut bytes = client_preface(&[]);
                bytes[PREFACE.len() + 3] = 0x1;
                bytes
            },
            // A SETTINGS frame too long to be one.
            {
                let mut bytes = client_preface(&[]);
                bytes[PREFACE.len()] = 0xff;
                bytes
            },
        ] {
            let (mut client, mut server) = pair().await;
            client.write_all(&garbage).await.unwrap();
            let error = read_opening(&mut server).await.unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        }
    }

    #[tokio::test]
    async fn a_request_shorter_than_the_preface_is_refused_without_waiting() {
        use futures::FutureExt;
        // The client keeps its end open, waiting for an answer.
        let (mut client, mut server) = tokio::io::duplex(1024);
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let refused = read_opening(&mut server)
            .now_or_never()
            .expect("refused on the bytes already sent, without waiting for more");
        assert_eq!(refused.unwrap_err().kind(), io::ErrorKind::InvalidData);
        drop(client);
    }

    #[tokio::test]
    async fn each_framed_magic_is_told_apart_and_what_follows_it_kept() {
        for (stream, magic) in FramedStream::ALL {
            let (mut client, mut server) = pair().await;
            let mut sent = magic.to_vec();
            sent.extend_from_slice(b"\0\0\0\x02hi");
            // In pieces: the magics share their first ten bytes, and are
            // told apart across reads.
            client.write_all(&sent[..5]).await.unwrap();
            let reading = tokio::spawn(async move { read_opening(&mut server).await.unwrap() });
            tokio::task::yield_now().await;
            client.write_all(&sent[5..11]).await.unwrap();
            tokio::task::yield_now().await;
            client.write_all(&sent[11..]).await.unwrap();
            let Opening::Framed(got, after) = reading.await.unwrap() else {
                panic!("a framed connection");
            };
            assert_eq!(got, stream);
            assert!(sent[magic.len()..].starts_with(&after));
        }
    }

    #[tokio::test]
    async fn a_wrong_byte_inside_the_magic_is_refused() {
        let (mut client, mut server) = pair().await;
        let mut sent = MAGIC.to_vec();
        sent[9] = b'2';
        sent.extend_from_slice(&[0; 40]);
        client.write_all(&sent).await.unwrap();
        let error = read_opening(&mut server).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn warnings_are_throttled() {
        let mut throttled = Throttled::default();
        let mut logged = Vec::new();
        for _ in 0..5 {
            throttled.warn(|suppressed| logged.push(suppressed));
        }
        assert_eq!(logged, [0]);
    }
}
