//! The replication stream without HTTP/2: what the `StreamAppend` call
//! carries, framed on a connection of its own (`raft.proto`, "the
//! replication stream without HTTP/2"; the frames are
//! `locksmith_proto::framed`'s).
//!
//! Why: a commit on a cluster waits for a round trip from the leader to its
//! followers, and on loopback a gRPC stream's trip takes twice a framed
//! one, with a third more CPU on both ends (docs/BENCHMARKS.md, "What
//! HTTP/2 and gRPC cost"). Members share two CPUs with each other and with
//! clients in the benchmarks, and everywhere the CPU a trip costs is CPU a
//! commit waits for.
//!
//! openraft opens a session (`RaftNetworkV2::stream_append`) for each run of
//! replication, and one for every heartbeat: twenty a second to each
//! follower. So a connection carries one session after another. The leader
//! ends a session's requests with an empty frame; the follower answers the
//! rest, and ends the session with an `end` frame that says whether the
//! connection goes on. A connection that goes on waits with the leader's
//! [`Idle`] connections towards that member for the next session; a
//! session that ends any other way closes its connection.
//!
//! - **Leader**: [`open`] (on a task of its own, so that a session given up
//!   on for its timeout still leaves the connection for the next one), then
//!   [`AppendSession`], the stream of answers, which sends the requests as
//!   openraft polls it: a request goes from openraft's replication task to
//!   the socket with no task between them.
//! - **Follower**: [`AppendStreams`], the accept loop's handler for the
//!   stream's magic. It hears members only (the same check as the `Raft`
//!   service's, on the connection's certificate), hands each session's
//!   requests to `Raft::stream_append`, and writes the answers, every ready
//!   one in one write.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use futures::{FutureExt, Sink, SinkExt, Stream, StreamExt};
use locksmith_proto::framed::{self, APPEND_MAGIC};
use locksmith_proto::raft::{append_frame::Kind, AppendAccepted, AppendFrame};
use locksmith_proto::transport::{dial, Connector, Io};
use openraft::raft::AppendEntriesRequest;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::oneshot;
use tokio_util::codec::{Framed, FramedRead, LengthDelimitedCodec};
use tonic::transport::server::Connected;
use tonic::{Request, Status};

use super::{Raft, TypeConfig};
use crate::accept::{Connection, FramedHandler};
use crate::framed_write::{gather, reuse};
use crate::tls::MemberCheck;

type AppendRequest = AppendEntriesRequest<TypeConfig>;

/// Idle connections kept towards one member, at most: one for the
/// replication session and one for a heartbeat, which overlap.
const IDLE_CONNECTIONS: usize = 2;

/// Bytes of requests waiting for the socket past which no more are taken
/// from openraft: a follower that reads nothing makes replication wait, not
/// this buffer grow (what HTTP/2's window did).
const MAX_UNSENT: usize = 1 << 20;

/// How long a follower keeps a connection on which the leader sends
/// nothing: a leader that vanished without closing it (its host gone)
/// would otherwise hold it, and a connection slot, for good. A live
/// leader sends a heartbeat every fraction of a second.
const IDLE_LIMIT: Duration = Duration::from_secs(60);

/// How long a follower's write of answers may wait for a leader that reads
/// nothing before the connection is closed (the leader starts another).
const WRITE_STALL: Duration = Duration::from_secs(20);

/// How long opening a connection may take (the connect, TLS, and the
/// member's acceptance), as the gRPC channel's connect timeout: an open
/// that hangs (a member's host gone, packets dropped) keeps every session
/// on gRPC while it lasts.
const OPEN_WITHIN: Duration = Duration::from_secs(1);

/// How long a leader replicates over gRPC to a member that refused the
/// framed stream (one of an earlier version, during a rolling upgrade)
/// before it asks again: once upgraded, the member gets the framed stream.
const REFUSAL_KEPT: Duration = Duration::from_secs(10);

/// A connection on which a member accepted the framed replication stream.
pub(super) struct AppendConnection {
    frames: Framed<Box<dyn Io>, LengthDelimitedCodec>,
}

/// The leader's framed connections towards one member: those no session
/// uses, an open under way, and a recent refusal.
#[derive(Default)]
pub(super) struct Connections {
    idle: Idle,
    opening: AtomicBool,
    refused: Mutex<Option<Instant>>,
}

/// Connections towards one member that no session uses.
#[derive(Default)]
struct Idle(Mutex<Vec<AppendConnection>>);

impl Idle {
    /// An idle connection still open, if any.
    fn take(&self) -> Option<AppendConnection> {
        let mut idle = self.0.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(mut connection) = idle.pop() {
            // The member closed it meanwhile (or, wrongly, wrote on it).
            if connection.frames.next().now_or_never().is_none() {
                return Some(connection);
            }
        }
        None
    }

    fn put(&self, connection: AppendConnection) {
        let mut idle = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < IDLE_CONNECTIONS {
            idle.push(connection);
        }
    }
}

/// How a session reaches its member.
pub(super) enum Route {
    /// On this framed connection.
    Framed(AppendConnection),
    /// Over gRPC: the member refused the framed stream lately, or a
    /// connection to it is being opened for a session before this one.
    Grpc,
}

impl Connections {
    /// A connection for the next session towards the member at `addr`: an
    /// idle one, or one opened now (over `tls` and through `connector` when
    /// given, its frames at most `max_frame` bytes).
    ///
    /// Cancel safety: safe. The open runs on a task of its own: given up
    /// on, it still opens, and its connection waits for the next session.
    pub(super) async fn route(
        self: &Arc<Self>,
        addr: &str,
        tls: Option<Arc<rustls::ClientConfig>>,
        connector: Option<&Connector>,
        max_frame: usize,
    ) -> Result<Route, Status> {
        let refused = *self.refused.lock().unwrap_or_else(|e| e.into_inner());
        if refused.is_some_and(|at| at.elapsed() < REFUSAL_KEPT) {
            return Ok(Route::Grpc);
        }
        if let Some(connection) = self.idle.take() {
            return Ok(Route::Framed(connection));
        }
        if self.opening.swap(true, Ordering::AcqRel) {
            return Ok(Route::Grpc);
        }
        let (opened_tx, opened) = oneshot::channel();
        let connections = self.clone();
        let (addr, connector) = (addr.to_owned(), connector.cloned());
        tokio::spawn(async move {
            let opening = open(&addr, tls, connector.as_ref(), max_frame);
            let result = tokio::time::timeout(OPEN_WITHIN, opening)
                .await
                .unwrap_or_else(|_| {
                    Err(framed::connection_error(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no framed replication stream within {OPEN_WITHIN:?}"),
                    )))
                });
            if let Ok(None) = result {
                tracing::info!(%addr, "a member without the framed replication stream (an earlier version): replicating to it over gRPC");
                *connections
                    .refused
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
            }
            connections.opening.store(false, Ordering::Release);
            if let Err(Ok(Some(connection))) = opened_tx.send(result) {
                connections.idle.put(connection);
            }
        });
        match opened.await {
            Ok(Ok(Some(connection))) => Ok(Route::Framed(connection)),
            Ok(Ok(None)) => Ok(Route::Grpc),
            Ok(Err(status)) => Err(status),
            Err(_) => Err(Status::unavailable("the connection's open was dropped")),
        }
    }
}

/// Opens a connection to the member at `addr` and asks for the framed
/// replication stream. `None`: the member does not speak it (it closed the
/// connection, or answered something else).
///
/// Cancel safety: safe; a dropped open closes what it opened.
async fn open(
    addr: &str,
    tls: Option<Arc<rustls::ClientConfig>>,
    connector: Option<&Connector>,
    max_frame: usize,
) -> Result<Option<AppendConnection>, Status> {
    let io = dial(addr, tls, connector)
        .await
        .map_err(framed::connection_error)?;
    let mut frames = Framed::new(io, framed::codec(max_frame));
    frames.write_buffer_mut().extend_from_slice(APPEND_MAGIC);
    SinkExt::<Bytes>::flush(&mut frames)
        .await
        .map_err(framed::connection_error)?;
    // Anything but an answer of the framed stream's is a member that does
    // not speak it: an earlier version's accept loop closes the connection,
    // a bare gRPC server writes HTTP/2's refusal first. gRPC reaches both.
    let Some(Ok(first)) = frames.next().await else {
        return Ok(None);
    };
    match kind_of(&first) {
        Ok(Kind::Accepted(_)) => Ok(Some(AppendConnection { frames })),
        Ok(Kind::End(end)) => Err(framed::append_status(end)),
        Ok(Kind::Answer(_)) | Err(_) => Ok(None),
    }
}

/// What a follower's frame is.
fn kind_of(frame: &[u8]) -> Result<Kind, Status> {
    framed::decode::<AppendFrame>(frame)
        .map_err(|status| Status::internal(status.message().to_owned()))?
        .kind
        .ok_or_else(|| Status::internal("the member sent an empty frame"))
}

/// One replication session on a framed connection, as the leader sees it:
/// the follower's answers (each openraft's `Result<StreamAppendResult,
/// Fatal>`, postcard-encoded), in the order of the requests. Polling it
/// first sends the requests openraft has made meanwhile.
///
/// Ends (`None`) when the follower ends the session without an error; the
/// connection then waits for the next session if the follower keeps it.
/// Any error closes the connection.
pub(super) struct AppendSession<S> {
    /// `None` once the session is over.
    connection: Option<AppendConnection>,
    requests: S,
    /// openraft has no more requests: the end of them is written.
    requests_ended: bool,
    /// Requests sent, for the caller's wait for answers.
    sent: Arc<AtomicU64>,
    connections: Arc<Connections>,
}

impl<S: Stream<Item = AppendRequest> + Unpin> AppendSession<S> {
    pub(super) fn new(
        connection: AppendConnection,
        requests: S,
        sent: Arc<AtomicU64>,
        connections: Arc<Connections>,
    ) -> AppendSession<S> {
        AppendSession {
            connection: Some(connection),
            requests,
            requests_ended: false,
            sent,
            connections,
        }
    }

    /// Puts every request made meanwhile into the connection's buffer (the
    /// end of them, an empty frame, once openraft has no more), and writes
    /// as much as the socket takes. A pending write registers `cx`.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        let Some(connection) = self.connection.as_mut() else {
            return Ok(());
        };
        let frames = &mut connection.frames;
        while !self.requests_ended && frames.write_buffer().len() < MAX_UNSENT {
            let request = match self.requests.poll_next_unpin(cx) {
                Poll::Ready(request) => request,
                Poll::Pending => break,
            };
            let encoded = request.map(|request| postcard::to_allocvec(&request));
            let buf = frames.write_buffer_mut();
            match encoded {
                Some(Ok(request)) => {
                    put_raw_frame(buf, &request);
                    self.sent.fetch_add(1, Ordering::Relaxed);
                }
                // A request that does not encode ends the session: sending
                // the ones after it would leave a gap.
                Some(Err(error)) => {
                    tracing::warn!(%error, "an AppendEntries request does not encode");
                    self.requests_ended = true;
                    put_raw_frame(buf, &[]);
                }
                None => {
                    self.requests_ended = true;
                    put_raw_frame(buf, &[]);
                }
            }
        }
        if !frames.write_buffer().is_empty() {
            if let Poll::Ready(result) = Sink::<Bytes>::poll_flush(Pin::new(frames), cx) {
                result?;
            }
        }
        Ok(())
    }

    /// Sends what is queued, then reads the next answer; `None` at the
    /// session's end.
    fn poll_answer(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Vec<u8>>, Status>> {
        self.poll_send(cx).map_err(framed::connection_error)?;
        let Some(connection) = self.connection.as_mut() else {
            return Poll::Ready(Ok(None));
        };
        let frame = match ready!(connection.frames.poll_next_unpin(cx)) {
            Some(frame) => frame.map_err(framed::read_error)?,
            None => {
                return Poll::Ready(Err(framed::connection_error(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the member closed the connection",
                ))))
            }
        };
        Poll::Ready(match kind_of(&frame)? {
            Kind::Answer(answer) => Ok(Some(answer)),
            Kind::End(end) => {
                let closing = end.closing;
                let status = framed::append_status(end);
                if status.code() != tonic::Code::Ok {
                    return Poll::Ready(Err(status));
                }
                let connection = self.connection.take().expect("checked above");
                let reusable = !closing
                    && self.requests_ended
                    && connection.frames.write_buffer().is_empty()
                    && connection.frames.read_buffer().is_empty();
                if reusable {
                    self.connections.idle.put(connection);
                }
                Ok(None)
            }
            Kind::Accepted(_) => Err(Status::internal(
                "the member accepted the replication stream a second time",
            )),
        })
    }
}

impl<S: Stream<Item = AppendRequest> + Unpin> Stream for AppendSession<S> {
    type Item = Result<Vec<u8>, Status>;

    /// Cancel safety: safe: an answer is taken whole or not at all, and
    /// what was queued to send stays in the connection's buffer.
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        match ready!(this.poll_answer(cx)) {
            Ok(answer) => Poll::Ready(answer.map(Ok)),
            Err(status) => {
                this.connection = None;
                Poll::Ready(Some(Err(status)))
            }
        }
    }
}

/// Appends `bytes` as one frame.
fn put_raw_frame(buf: &mut BytesMut, bytes: &[u8]) {
    buf.reserve(4 + bytes.len());
    buf.put_u32(u32::try_from(bytes.len()).expect("a request within the frame limit"));
    buf.put_slice(bytes);
}

/// Serves members' framed replication streams: one connection after
/// another session, each handed to openraft.
pub(crate) struct AppendStreams {
    raft: Raft,
    members: MemberCheck,
    /// The largest frame a leader may send: a member's message limit.
    max_frame: usize,
}

impl AppendStreams {
    pub(crate) fn new(raft: Raft, members: MemberCheck, max_frame: usize) -> AppendStreams {
        AppendStreams {
            raft,
            members,
            max_frame,
        }
    }

    /// What the accept loop hands a connection with the stream's magic to.
    pub(crate) fn handler<S>(self) -> FramedHandler<S>
    where
        S: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    {
        let streams = Arc::new(self);
        Arc::new(move |connection| {
            tokio::spawn(streams.clone().serve(connection));
        })
    }

    /// Checks the member, then serves its sessions until the leader closes
    /// the connection, leaves it idle for [`IDLE_LIMIT`], or a session ends
    /// with an error.
    ///
    /// Cancel safety: runs as its own task; dropped, it closes the
    /// connection (openraft keeps what it appended).
    async fn serve<S>(self: Arc<Self>, connection: Connection<S>)
    where
        S: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    {
        let mut request = Request::new(());
        request.extensions_mut().insert(connection.connect_info());
        let (read, mut write) = tokio::io::split(connection);
        let mut buf = BytesMut::new();
        if let Err(status) = self.members.check(&request) {
            framed::put_frame(&mut buf, &framed::append_end(&status, true));
            let _ = write.write_all(&buf).await;
            let _ = write.shutdown().await;
            return;
        }
        let accepted = AppendFrame {
            kind: Some(Kind::Accepted(AppendAccepted {})),
        };
        framed::put_frame(&mut buf, &accepted);
        // The leader sends nothing until it has read this.
        if write.write_all(&buf).await.is_err() {
            return;
        }
        buf.clear();
        let mut frames = FramedRead::new(read, framed::codec(self.max_frame));
        loop {
            let first = match tokio::time::timeout(IDLE_LIMIT, frames.next()).await {
                Ok(Some(first)) => first,
                Ok(None) => break,
                Err(_) => {
                    tracing::debug!(
                        ?IDLE_LIMIT,
                        "a leader's replication connection was idle; closed"
                    );
                    break;
                }
            };
            let (handed_back, back) = oneshot::channel();
            let requests = SessionRequests {
                first: Some(first),
                frames: Some(frames),
                handed_back: Some(handed_back),
            };
            let answers = self.raft.stream_append(requests);
            match write_session(answers, back, &mut buf, &mut write).await {
                Some(next) => frames = next,
                None => break,
            }
        }
        let _ = write.shutdown().await;
    }
}

/// Writes one session's answers (after what `buf` holds already), then its
/// end; returns the connection's reading side when it goes on.
///
/// Cancel safety: not meant to be dropped midway (a frame could be cut);
/// it runs to the session's end on the connection's task.
async fn write_session<S, R, W>(
    answers: S,
    mut back: oneshot::Receiver<HandedBack<R>>,
    buf: &mut BytesMut,
    write: &mut WriteHalf<W>,
) -> Option<FramedRead<ReadHalf<R>, LengthDelimitedCodec>>
where
    S: Stream<
        Item = Result<
            openraft::raft::StreamAppendResult<TypeConfig>,
            openraft::errors::Fatal<TypeConfig>,
        >,
    >,
    W: AsyncWrite,
{
    let mut answers = std::pin::pin!(answers);
    let mut next = None;
    loop {
        let ended = gather(&mut answers, buf, |buf, answer| {
            let Some(answer) = answer else {
                // The requests' reader has handed the connection back if
                // the leader ended them; if openraft stopped before their
                // end, what is left of them is unread: the connection
                // closes.
                let status = match back.try_recv() {
                    Ok(Ok(frames)) => {
                        next = Some(frames);
                        Status::ok("")
                    }
                    Ok(Err(status)) => status,
                    Err(_) => Status::ok(""),
                };
                framed::put_frame(buf, &framed::append_end(&status, next.is_none()));
                return true;
            };
            match postcard::to_allocvec(&answer) {
                Ok(answer) => {
                    framed::put_frame(
                        buf,
                        &AppendFrame {
                            kind: Some(Kind::Answer(answer)),
                        },
                    );
                    false
                }
                Err(error) => {
                    let status = Status::internal(format!("an answer does not encode: {error}"));
                    framed::put_frame(buf, &framed::append_end(&status, true));
                    true
                }
            }
        })
        .await;
        match tokio::time::timeout(WRITE_STALL, write.write_all(buf)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return None,
            Err(_) => {
                tracing::debug!(
                    ?WRITE_STALL,
                    "a leader read none of its replication answers; closing its connection"
                );
                return None;
            }
        }
        reuse(buf);
        if ended {
            return next;
        }
    }
}

/// What a session's requests hand back when they end: the connection's
/// reading side at the leader's end of them, or why they ended early.
type HandedBack<R> = Result<FramedRead<ReadHalf<R>, LengthDelimitedCodec>, Status>;

/// One session's requests as openraft takes them: the frames up to the
/// leader's empty one, decoded. openraft needs a stream of its own
/// (`'static`), so the connection's reading side moves in, and is handed
/// back at the end.
struct SessionRequests<R> {
    first: Option<io::Result<BytesMut>>,
    /// `None` once ended.
    frames: Option<FramedRead<ReadHalf<R>, LengthDelimitedCodec>>,
    handed_back: Option<oneshot::Sender<HandedBack<R>>>,
}

impl<R> SessionRequests<R> {
    fn end(&mut self, how: Result<(), Status>) -> Poll<Option<AppendRequest>> {
        let frames = self.frames.take();
        if let (Some(handed_back), Some(frames)) = (self.handed_back.take(), frames) {
            let _ = handed_back.send(how.map(|()| frames));
        }
        Poll::Ready(None)
    }
}

impl<R: AsyncRead> Stream for SessionRequests<R> {
    type Item = AppendRequest;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<AppendRequest>> {
        let this = self.get_mut();
        let frame = match this.first.take() {
            Some(first) => first,
            None => {
                let Some(frames) = this.frames.as_mut() else {
                    return Poll::Ready(None);
                };
                match ready!(frames.poll_next_unpin(cx)) {
                    Some(frame) => frame,
                    None => Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the leader closed the connection within a session",
                    )),
                }
            }
        };
        match frame {
            Ok(frame) if frame.is_empty() => this.end(Ok(())),
            Ok(frame) => match postcard::from_bytes(&frame) {
                Ok(request) => Poll::Ready(Some(request)),
                Err(error) => {
                    tracing::warn!(%error, "a replication stream from the leader ended");
                    this.end(Err(Status::invalid_argument(format!(
                        "an AppendEntries request does not decode: {error}"
                    ))))
                }
            },
            Err(error) => {
                let status = framed::read_error(error);
                if status.code() == tonic::Code::OutOfRange {
                    tracing::warn!(%status, "a replication stream from the leader ended");
                }
                this.end(Err(status))
            }
        }
    }
}
