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
//! ends a session's requests with a frame of no request; the follower
//! answers the rest, and ends the session with an `end` frame that says
//! whether the connection goes on. A connection that goes on waits with
//! the leader's [`Idle`] connections towards that member for the next
//! session; a session that ends any other way closes its connection.
//!
//! Answers are paired with requests by their order alone, so every frame
//! carries a sequence number (the leader's in its first 8 bytes, the
//! follower's in `AppendFrame::seq`, the number of the frame it answers),
//! and a number out of its place ends the stream with `DATA_LOSS`. TCP
//! loses nothing from within a connection, but a connection that did (the
//! simulator's network drops messages across a partition and keeps the
//! connection) would otherwise pair answers with the wrong requests, or
//! wait for answers never coming until the replication timeout; HTTP/2's
//! own framing did the same check for the `StreamAppend` call.
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
    /// The sequence number of the next frame to send.
    next_seq: u64,
    /// The sequence number the next answer must carry: the oldest frame
    /// sent and not answered.
    next_answer: u64,
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
                tracing::info!(
                    %addr,
                    ?REFUSAL_KEPT,
                    "a member did not take the framed replication stream (one of an earlier \
                     version, or stopping): replicating to it over gRPC for a while"
                );
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
        Ok(Kind::Accepted(_)) => Ok(Some(AppendConnection {
            frames,
            next_seq: 0,
            next_answer: 0,
        })),
        Ok(Kind::End(end)) => Err(framed::append_status(end)),
        Ok(Kind::Answer(_)) | Err(_) => Ok(None),
    }
}

/// What a follower's frame is.
fn kind_of(frame: &[u8]) -> Result<Kind, Status> {
    Ok(sequenced_kind_of(frame)?.1)
}

/// What a follower's frame is, and the sequence number it carries.
fn sequenced_kind_of(frame: &[u8]) -> Result<(u64, Kind), Status> {
    let frame = framed::decode::<AppendFrame>(frame)
        .map_err(|status| Status::internal(status.message().to_owned()))?;
    let kind = frame
        .kind
        .ok_or_else(|| Status::internal("the member sent an empty frame"))?;
    Ok((frame.seq, kind))
}

/// The error of a frame that is not the one expected: one went missing.
fn out_of_sequence(what: &str, expected: u64, got: u64) -> Status {
    Status::data_loss(format!(
        "{what} out of sequence: expected frame {expected}, got {got} (a frame went missing)"
    ))
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
        while !self.requests_ended && connection.frames.write_buffer().len() < MAX_UNSENT {
            let request = match self.requests.poll_next_unpin(cx) {
                Poll::Ready(request) => request,
                Poll::Pending => break,
            };
            let encoded = request.map(|request| postcard::to_allocvec(&request));
            match encoded {
                Some(Ok(request)) => {
                    connection.put_frame(&request);
                    self.sent.fetch_add(1, Ordering::Relaxed);
                }
                // A request that does not encode ends the session: sending
                // the ones after it would leave a gap.
                Some(Err(error)) => {
                    tracing::warn!(%error, "an AppendEntries request does not encode");
                    self.requests_ended = true;
                    connection.put_frame(&[]);
                }
                None => {
                    self.requests_ended = true;
                    connection.put_frame(&[]);
                }
            }
        }
        let frames = &mut connection.frames;
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
        let (seq, kind) = sequenced_kind_of(&frame)?;
        Poll::Ready(match kind {
            Kind::Answer(answer) => {
                if seq != connection.next_answer {
                    return Poll::Ready(Err(out_of_sequence(
                        "an answer",
                        connection.next_answer,
                        seq,
                    )));
                }
                connection.next_answer += 1;
                Ok(Some(answer))
            }
            Kind::End(end) => {
                let closing = end.closing;
                let status = framed::append_status(end);
                if status.code() != tonic::Code::Ok {
                    return Poll::Ready(Err(status));
                }
                if !closing && seq != connection.next_seq - 1 {
                    let last = connection.next_seq - 1;
                    return Poll::Ready(Err(out_of_sequence("a session's end", last, seq)));
                }
                let mut connection = self.connection.take().expect("checked above");
                // The next session's answers start after this session's end.
                connection.next_answer = connection.next_seq;
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

/// Bytes of the sequence number that starts each of the leader's frames.
const SEQ_BYTES: usize = 8;

impl AppendConnection {
    /// Queues `request` (postcard bytes; none for the end of a session's
    /// requests) as the next frame, after its sequence number.
    fn put_frame(&mut self, request: &[u8]) {
        let buf = self.frames.write_buffer_mut();
        let len = SEQ_BYTES + request.len();
        buf.reserve(4 + len);
        buf.put_u32(u32::try_from(len).expect("a request within the frame limit"));
        buf.put_u64(self.next_seq);
        buf.put_slice(request);
        self.next_seq += 1;
    }
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
            framed::put_frame(&mut buf, &framed::append_end(&status, true, 0));
            let _ = write.write_all(&buf).await;
            let _ = write.shutdown().await;
            return;
        }
        let accepted = AppendFrame {
            seq: 0,
            kind: Some(Kind::Accepted(AppendAccepted {})),
        };
        framed::put_frame(&mut buf, &accepted);
        // The leader sends nothing until it has read this.
        if write.write_all(&buf).await.is_err() {
            return;
        }
        buf.clear();
        let mut reading = Reading {
            frames: FramedRead::new(read, framed::codec(self.max_frame)),
            next_seq: 0,
        };
        loop {
            let first = match tokio::time::timeout(IDLE_LIMIT, reading.frames.next()).await {
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
            let first_seq = reading.next_seq;
            let requests = SessionRequests {
                first: Some(first),
                reading: Some(reading),
                handed_back: Some(handed_back),
            };
            let answers = self.raft.stream_append(requests);
            match write_session(answers, first_seq, back, &mut buf, &mut write).await {
                Some(next) => reading = next,
                None => break,
            }
        }
        let _ = write.shutdown().await;
    }
}

/// Writes one session's answers (after what `buf` holds already), the first
/// numbered `first_seq`, then its end; returns the connection's reading
/// side when it goes on.
///
/// Cancel safety: not meant to be dropped midway (a frame could be cut);
/// it runs to the session's end on the connection's task.
async fn write_session<S, R, W>(
    answers: S,
    first_seq: u64,
    mut back: oneshot::Receiver<HandedBack<R>>,
    buf: &mut BytesMut,
    write: &mut WriteHalf<W>,
) -> Option<Reading<R>>
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
    let mut next: Option<Reading<R>> = None;
    let mut seq = first_seq;
    loop {
        let ended = gather(&mut answers, buf, |buf, answer| {
            let Some(answer) = answer else {
                // The requests' reader has handed the connection back if
                // the leader ended them; if openraft stopped before their
                // end, what is left of them is unread: the connection
                // closes.
                let status = match back.try_recv() {
                    Ok(Ok(reading)) => {
                        next = Some(reading);
                        Status::ok("")
                    }
                    Ok(Err(status)) => status,
                    Err(_) => Status::ok(""),
                };
                // The number of the frame that ended the session's
                // requests, when they were read to their end.
                let ended_by = next.as_ref().map_or(0, |reading| reading.next_seq - 1);
                let end = framed::append_end(&status, next.is_none(), ended_by);
                framed::put_frame(buf, &end);
                return true;
            };
            match postcard::to_allocvec(&answer) {
                Ok(answer) => {
                    let frame = AppendFrame {
                        seq,
                        kind: Some(Kind::Answer(answer)),
                    };
                    framed::put_frame(buf, &frame);
                    seq += 1;
                    false
                }
                Err(error) => {
                    let status = Status::internal(format!("an answer does not encode: {error}"));
                    framed::put_frame(buf, &framed::append_end(&status, true, 0));
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

/// The follower's reading side of a connection: its frames, and the
/// sequence number the next must carry.
struct Reading<R> {
    frames: FramedRead<ReadHalf<R>, LengthDelimitedCodec>,
    next_seq: u64,
}

/// What a session's requests hand back when they end: the connection's
/// reading side at the leader's end of them, or why they ended early.
type HandedBack<R> = Result<Reading<R>, Status>;

/// One session's requests as openraft takes them: the frames up to the
/// leader's end of them, checked for their sequence and decoded. openraft
/// needs a stream of its own (`'static`), so the connection's reading side
/// moves in, and is handed back at the end.
struct SessionRequests<R> {
    first: Option<io::Result<BytesMut>>,
    /// `None` once ended.
    reading: Option<Reading<R>>,
    handed_back: Option<oneshot::Sender<HandedBack<R>>>,
}

impl<R> SessionRequests<R> {
    fn end(&mut self, how: Result<(), Status>) -> Poll<Option<AppendRequest>> {
        let reading = self.reading.take();
        if let (Some(handed_back), Some(reading)) = (self.handed_back.take(), reading) {
            let _ = handed_back.send(how.map(|()| reading));
        }
        Poll::Ready(None)
    }

    /// The request in a frame, `None` for the end of the session's
    /// requests.
    fn request_in(&mut self, frame: &[u8]) -> Result<Option<AppendRequest>, Status> {
        let reading = self.reading.as_mut().expect("read from an open session");
        let Some((seq, request)) = frame.split_first_chunk::<SEQ_BYTES>() else {
            return Err(Status::invalid_argument(
                "a replication frame without its sequence number",
            ));
        };
        let seq = u64::from_be_bytes(*seq);
        if seq != reading.next_seq {
            return Err(out_of_sequence("a request", reading.next_seq, seq));
        }
        reading.next_seq += 1;
        if request.is_empty() {
            return Ok(None);
        }
        postcard::from_bytes(request).map(Some).map_err(|error| {
            Status::invalid_argument(format!("an AppendEntries request does not decode: {error}"))
        })
    }
}

impl<R: AsyncRead> Stream for SessionRequests<R> {
    type Item = AppendRequest;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<AppendRequest>> {
        let this = self.get_mut();
        let frame = match this.first.take() {
            Some(first) => first,
            None => {
                let Some(reading) = this.reading.as_mut() else {
                    return Poll::Ready(None);
                };
                match ready!(reading.frames.poll_next_unpin(cx)) {
                    Some(frame) => frame,
                    None => Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the leader closed the connection within a session",
                    )),
                }
            }
        };
        match frame.map(|frame| this.request_in(&frame)) {
            Ok(Ok(Some(request))) => Poll::Ready(Some(request)),
            Ok(Ok(None)) => this.end(Ok(())),
            Ok(Err(status)) => {
                tracing::warn!(%status, "a replication stream from the leader ended");
                this.end(Err(status))
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::type_config::alias::VoteOf;

    fn heartbeat() -> AppendRequest {
        AppendRequest {
            vote: VoteOf::<TypeConfig>::new_committed(1, 1),
            prev_log_id: None,
            leader_commit: None,
            entries: Vec::new(),
        }
    }

    /// An answer that does not carry the number of the oldest request
    /// unanswered (the request, or an answer before it, went missing)
    /// ends the session with `DATA_LOSS`: it would be taken for another
    /// request's answer.
    #[tokio::test]
    async fn an_answer_out_of_sequence_ends_the_session() {
        let (leader, follower) = tokio::io::duplex(1 << 16);
        let connection = AppendConnection {
            frames: Framed::new(Box::new(leader) as Box<dyn Io>, framed::codec(1 << 20)),
            next_seq: 0,
            next_answer: 0,
        };
        let mut session = AppendSession::new(
            connection,
            futures::stream::iter([heartbeat()]),
            Arc::default(),
            Arc::default(),
        );
        let mut follower = Framed::new(follower, framed::codec(1 << 20));
        let answering = tokio::spawn(async move {
            let request = follower.next().await.unwrap().unwrap();
            assert_eq!(
                request[..SEQ_BYTES],
                0u64.to_be_bytes(),
                "the first frame is 0"
            );
            let answer: Result<openraft::raft::StreamAppendResult<TypeConfig>, ()> = Ok(Ok(None));
            let mut buf = BytesMut::new();
            let frame = AppendFrame {
                seq: 1,
                kind: Some(Kind::Answer(postcard::to_allocvec(&answer).unwrap())),
            };
            framed::put_frame(&mut buf, &frame);
            follower.get_mut().write_all(&buf).await.unwrap();
            follower
        });
        let error = session
            .next()
            .await
            .expect("an item")
            .expect_err("an answer out of sequence");
        assert_eq!(error.code(), tonic::Code::DataLoss, "{error:?}");
        assert!(
            error.message().contains("expected frame 0, got 1"),
            "{error:?}"
        );
        assert!(session.next().await.is_none(), "the session is over");
        drop(answering.await.unwrap());
    }
}
