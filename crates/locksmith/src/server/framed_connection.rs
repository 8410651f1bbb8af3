//! The session stream without HTTP/2 (`locksmith_proto::framed`, the URL's
//! default `session_transport=framed`): the stream's batches as frames on a
//! connection of its own.
//!
//! The session driver's task does all of it: each poll of
//! [`Inbound::message`] first writes what the session queued, then reads.
//! A request's way through the client is two tasks, the caller's and the
//! driver's, with nothing between the driver and the socket: no HTTP/2
//! connection task to wake (module `stream_connection` runs HTTP/2's in the
//! driver's task too, for the gRPC stream), no frame, header or window of
//! HTTP/2's to encode.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::{Sink, Stream};
use locksmith_proto::framed;
use locksmith_proto::transport::{dial, Connector, Io};
use locksmith_proto::v1 as pb;
use pb::framed_server_frame::Kind;
use tokio_util::bytes::Bytes;
use tokio_util::codec::{Framed, LengthDelimitedCodec};
use tonic::service::Interceptor;
use tonic::Status;

use super::stream_connection::CONNECT_WITHIN;
use super::url::ServerUrl;
use super::MAX_RESPONSE_BYTES;

/// Bytes written but not yet taken by the socket past which no more batches
/// are taken from the session's queue: a server that reads nothing makes
/// the queue wait, not this buffer grow (what HTTP/2's window does for the
/// gRPC stream).
const MAX_UNSENT: usize = 256 << 10;

/// The client's batches, as the session queues them.
type Outbound = Pin<Box<dyn Stream<Item = pb::ClientBatch> + Send>>;

/// A framed session stream: the connection, and the batches to send on it.
pub(super) struct Inbound {
    frames: Framed<Box<dyn Io>, LengthDelimitedCodec>,
    outbound: Outbound,
    /// Where the client's side is.
    sending: Sending,
}

/// The client's side of the stream.
#[derive(PartialEq)]
enum Sending {
    /// Batches go out as the session queues them.
    Open,
    /// The session sends no more: what is written is flushed, then the
    /// connection's write side is shut (the end of the request stream).
    Ending,
    Ended,
}

/// Opens a framed session stream on a new connection to `addr` (over
/// `connector` when given, else TCP; over TLS when `url` asks for it),
/// sending what `outbound` yields. Returns once the server has accepted the
/// stream.
///
/// Errors as the gRPC call's: a connection that could not be opened or
/// broke is an `UNAVAILABLE` status with the I/O error as its source; a
/// refusal is the status the server sent.
///
/// Cancel safety: safe; a dropped open closes what it opened.
pub(super) async fn open(
    addr: &str,
    url: &ServerUrl,
    connector: Option<&Connector>,
    outbound: impl Stream<Item = pb::ClientBatch> + Send + 'static,
) -> Result<Inbound, Status> {
    let io = tokio::time::timeout(CONNECT_WITHIN, dial(addr, url.framed_rustls(), connector))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))
        .and_then(|dialed| dialed)
        .map_err(framed::connection_error)?;
    let mut frames = Framed::new(io, framed::codec(MAX_RESPONSE_BYTES));
    let headers = url
        .credentials()
        .call(tonic::Request::new(()))
        .expect("the credentials add a header and refuse nothing");
    let buf = frames.write_buffer_mut();
    buf.extend_from_slice(framed::MAGIC);
    framed::put_frame(buf, &framed::hello(headers.metadata()));
    let mut inbound = Inbound {
        frames,
        outbound: Box::pin(outbound),
        sending: Sending::Open,
    };
    let first = std::future::poll_fn(|cx| inbound.poll_frame(cx))
        .await
        .map_err(not_accepted)?;
    match first {
        Kind::Accepted(_) => Ok(inbound),
        Kind::Status(status) => Err(framed::status_of(status)),
        Kind::Batch(_) => Err(Status::internal(
            "the server sent a batch before it accepted the stream",
        )),
    }
}

/// A connection that ends before the server's first frame: what a server
/// older than the framed stream does (it closes a connection that does not
/// start as HTTP/2), so the error says how to reach one. Still the
/// connection's failure (its source kept), for the member's bookkeeping.
fn not_accepted(status: Status) -> Status {
    let Some(source) = std::error::Error::source(&status)
        .and_then(|source| source.downcast_ref::<io::Error>())
        .filter(|error| {
            matches!(
                error.kind(),
                io::ErrorKind::UnexpectedEof
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::BrokenPipe
            )
        })
    else {
        return status;
    };
    framed::connection_error(io::Error::new(
        source.kind(),
        format!(
            "{source} before it accepted the framed session stream \
             (a server older than this client? session_transport=grpc in the URL reaches one)"
        ),
    ))
}

impl Inbound {
    /// The next batch, sending what the session queued meanwhile; `None`
    /// once the server ended the stream without an error.
    ///
    /// Cancel safety: safe: a frame is taken whole or not at all, and what
    /// was queued to send stays in the connection's buffer.
    pub(super) async fn message(&mut self) -> Result<Option<pb::ServerBatch>, Status> {
        std::future::poll_fn(|cx| {
            Poll::Ready(match std::task::ready!(self.poll_frame(cx))? {
                Kind::Batch(batch) => Ok(Some(batch)),
                Kind::Status(status) => {
                    let status = framed::status_of(status);
                    if status.code() == tonic::Code::Ok {
                        Ok(None)
                    } else {
                        Err(status)
                    }
                }
                Kind::Accepted(_) => Err(Status::internal(
                    "the server accepted the stream a second time",
                )),
            })
        })
        .await
    }

    /// Sends what is queued, then reads the next frame.
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Result<Kind, Status>> {
        self.poll_send(cx).map_err(framed::connection_error)?;
        let frame = match std::task::ready!(Pin::new(&mut self.frames).poll_next(cx)) {
            Some(frame) => frame.map_err(framed::read_error)?,
            None => {
                return Poll::Ready(Err(framed::connection_error(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the server closed the connection",
                ))))
            }
        };
        let frame = framed::decode::<pb::FramedServerFrame>(&frame)
            .map_err(|status| Status::internal(status.message().to_owned()))?;
        Poll::Ready(
            frame
                .kind
                .ok_or_else(|| Status::internal("the server sent an empty frame")),
        )
    }

    /// Puts every batch queued into the connection's buffer and writes as
    /// much of it as the socket takes; shuts the write side once the
    /// session sends no more. Pending writes register `cx`.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        while self.sending == Sending::Open && self.frames.write_buffer().len() < MAX_UNSENT {
            match self.outbound.as_mut().poll_next(cx) {
                Poll::Ready(Some(batch)) => {
                    framed::put_frame(self.frames.write_buffer_mut(), &batch)
                }
                Poll::Ready(None) => self.sending = Sending::Ending,
                Poll::Pending => break,
            }
        }
        let frames = Pin::new(&mut self.frames);
        match self.sending {
            Sending::Open if !frames.write_buffer().is_empty() => {
                if let Poll::Ready(result) = Sink::<Bytes>::poll_flush(frames, cx) {
                    result?;
                }
            }
            Sending::Ending => {
                if let Poll::Ready(result) = Sink::<Bytes>::poll_close(frames, cx) {
                    result?;
                    self.sending = Sending::Ended;
                }
            }
            Sending::Open | Sending::Ended => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// A server that closes every connection at its first byte, as one
    /// from before the framed stream does with a connection that does not
    /// start as HTTP/2.
    #[tokio::test]
    async fn a_server_that_closes_at_once_is_named_as_maybe_older() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.unwrap();
            let _ = tcp.read(&mut [0; 1]).await;
        });
        let url = ServerUrl::parse(&format!("locksmith://{addr}")).unwrap();
        let Err(status) = open(&addr, &url, None, futures::stream::pending()).await else {
            panic!("a closed connection opens no stream");
        };
        assert!(
            status.message().contains("session_transport=grpc"),
            "{status}"
        );
        assert!(
            std::error::Error::source(&status).is_some(),
            "still the connection's failure"
        );
    }
}
