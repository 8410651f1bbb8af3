//! The session stream without HTTP/2 (`locksmith_proto::framed`): a
//! connection the accept loop found to start with the framed magic comes
//! here instead of to tonic.
//!
//! The stream itself is the `Session` call's: the caller is identified from
//! the hello as from the call's headers (module `auth`), and the same
//! [`SessionReader`] reads the client's batches, so every rule, limit and
//! answer is the call's. What differs is only how bytes move. Each
//! connection has two tasks, as a gRPC stream has (its reader, and the
//! HTTP/2 connection's task that writes): the reader reads frames straight
//! from the socket, and [`write_replies`] writes what the core queues for
//! the stream, everything queued at once in one write.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use futures::StreamExt;
use locksmith_proto::framed;
use locksmith_proto::v1 as pb;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, WriteHalf};
use tokio::sync::oneshot;
use tokio_util::codec::FramedRead;
use tonic::transport::server::Connected;
use tonic::{Request, Status};

use crate::accept::{Connection, FramedHandler};
use crate::framed_write::{gather, reuse};
use crate::service::Service;
use crate::stream_queue::StreamRx;

/// How long one write of replies may wait for a client that reads nothing
/// before the connection is closed: HTTP/2's keep-alive timeout on the
/// gRPC stream (`lib.rs`), which a client that stops reading cannot answer
/// either. The session lives on by its TTL, for its client to resume.
const WRITE_STALL: Duration = Duration::from_secs(20);

/// Serves framed session streams: one per connection.
#[derive(Clone)]
pub(crate) struct FramedSessions {
    service: Service,
    /// How long a connection may take to send its hello (the accept loop's
    /// handshake timeout, which the magic was read within).
    handshake_timeout: Duration,
    /// The largest frame a client may send: the server's message limit.
    max_frame: usize,
}

impl FramedSessions {
    pub(crate) fn new(
        service: Service,
        handshake_timeout: Duration,
        max_frame: usize,
    ) -> FramedSessions {
        FramedSessions {
            service,
            handshake_timeout,
            max_frame,
        }
    }

    /// What the accept loop hands a framed connection to.
    pub(crate) fn handler<S>(self) -> FramedHandler<S>
    where
        S: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    {
        Arc::new(move |connection| self.serve(connection))
    }

    /// Serves the session stream of `connection` on tasks of its own.
    fn serve<S>(&self, connection: Connection<S>)
    where
        S: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    {
        tokio::spawn(self.clone().run(connection));
    }

    /// Reads the hello, opens the stream (or says why not) and writes its
    /// replies until it ends.
    ///
    /// Cancel safety: runs as its own task; dropped, it closes the
    /// connection, and the session lives on by its TTL.
    async fn run<S>(self, connection: Connection<S>)
    where
        S: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    {
        let connect_info = connection.connect_info();
        let (read, mut write) = tokio::io::split(connection);
        let mut frames = FramedRead::new(read, framed::codec(self.max_frame));
        let hello = match tokio::time::timeout(self.handshake_timeout, frames.next()).await {
            Err(_) => return tracing::debug!("no framed hello in time; closed"),
            Ok(None) => return,
            Ok(Some(frame)) => frame
                .map_err(framed::read_error)
                .and_then(|frame| framed::decode::<pb::FramedHello>(&frame))
                .and_then(framed::metadata_of),
        };
        // The hello's headers and the connection's peer and certificates,
        // where tonic would put them, for the checks the call makes.
        let opened = hello.and_then(|metadata| {
            let mut request = Request::from_parts(metadata, Default::default(), ());
            request.extensions_mut().insert(connect_info);
            let (writer_done, written) = oneshot::channel::<()>();
            let batches = frames
                .map(|frame| {
                    frame
                        .map_err(framed::read_error)
                        .and_then(|frame| framed::decode::<pb::ClientBatch>(&frame))
                })
                // Reading ends with the stream: a client that never closes
                // its side keeps no reader once the stream is over.
                .take_until(written);
            let replies = self.service.open_session(&request, Box::pin(batches))?;
            Ok((replies, writer_done))
        });
        match opened {
            Ok((replies, _writer_done)) => write_replies(replies, &mut write).await,
            Err(status) => {
                let mut buf = BytesMut::new();
                framed::put_frame(&mut buf, &framed::status_frame(&status));
                let _ = write.write_all(&buf).await;
            }
        }
        let _ = write.shutdown().await;
    }
}

/// Writes the stream's frames: `accepted`, each batch the core queues
/// (everything queued by the time a write starts goes in that write), and
/// the status that ends it, or `OK` when the core ends it without one.
///
/// Gives up, and so closes the connection, when a write waits
/// [`WRITE_STALL`] for the client to read.
///
/// Cancel safety: not meant to be dropped midway (a frame could be cut);
/// it runs to the stream's end on the connection's task.
async fn write_replies<W: AsyncWrite + Unpin>(mut replies: StreamRx, write: &mut WriteHalf<W>) {
    let mut buf = BytesMut::new();
    let accepted = pb::FramedServerFrame {
        kind: Some(pb::framed_server_frame::Kind::Accepted(
            pb::FramedAccepted {},
        )),
    };
    framed::put_frame(&mut buf, &accepted);
    loop {
        let ended = gather(&mut replies, &mut buf, put_reply).await;
        match tokio::time::timeout(WRITE_STALL, write.write_all(&buf)).await {
            Ok(Ok(())) => {}
            // The client is gone, or reads nothing: the connection closes,
            // and the core detaches the stream once its reader has ended.
            Ok(Err(_)) => return,
            Err(_) => {
                return tracing::debug!(
                    ?WRITE_STALL,
                    "a framed client read none of its replies; closing its connection"
                )
            }
        }
        if ended {
            return;
        }
        reuse(&mut buf);
    }
}

/// Appends the frame of one item from the core's queue; true when it ends
/// the stream: a status, the queue's end, or a batch that says the session
/// ended (the core sends nothing after it). A stream whose session ended is
/// over at once, as the protocol says: its connection does not wait for
/// the client to close its side first.
fn put_reply(buf: &mut BytesMut, reply: Option<Result<pb::ServerBatch, Status>>) -> bool {
    let status = match reply {
        Some(Ok(batch)) => {
            let session_ended = batch
                .messages
                .iter()
                .any(|m| matches!(m.kind, Some(pb::server_message::Kind::Ended(_))));
            let frame = pb::FramedServerFrame {
                kind: Some(pb::framed_server_frame::Kind::Batch(batch)),
            };
            framed::put_frame(buf, &frame);
            if !session_ended {
                return false;
            }
            Status::ok("")
        }
        Some(Err(status)) => status,
        None => Status::ok(""),
    };
    framed::put_frame(buf, &framed::status_frame(&status));
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream_queue::stream_queue;

    /// A client that reads nothing cannot keep the connection, nor its
    /// tasks, for longer than [`WRITE_STALL`].
    #[tokio::test(start_paused = true)]
    async fn a_client_that_reads_nothing_is_let_go() {
        let (tx, replies) = stream_queue(1 << 20);
        let heartbeat = pb::ServerMessage {
            kind: Some(pb::server_message::Kind::Heartbeat(pb::HeartbeatAck {
                now_ms: 1,
            })),
        };
        tx.send(pb::ServerBatch {
            messages: vec![heartbeat; 100],
        })
        .unwrap();
        // 64 bytes of room, and nobody reading the other end.
        let (_client, server) = tokio::io::duplex(64);
        let (_read, mut write) = tokio::io::split(server);
        let started = tokio::time::Instant::now();
        tokio::time::timeout(3 * WRITE_STALL, write_replies(replies, &mut write))
            .await
            .expect("the writer gives up on a client that reads nothing");
        assert!(started.elapsed() >= WRITE_STALL);
        drop(tx);
    }
}
