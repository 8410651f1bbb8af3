//! The reading side of one session stream: a task that forwards the
//! client's batches to the core until the stream or the session ends.
//!
//! Reading runs apart from writing, which is the transport's own task for
//! the stream: a client blocked sending (its request window full) reads
//! none of its replies, so a reader that waited for the replies to go out
//! would wait forever. It is written as a future by hand rather than as an
//! `async fn`, because every idle session keeps one for as long as it
//! lives: the `async fn` it replaces held every await point's state at
//! once, about 2 KiB a session; this one is the stream's decoder and a few
//! fields.
//!
//! Heartbeats it answers itself while the core lets it and the member leads
//! under its lease (module [`crate::pulse`]); everything else goes to the
//! core.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Future, Stream};
use locksmith_proto::v1 as pb;
use tokio::time::Sleep;
use tonic::{Status, Streaming};

use crate::convert;
use crate::op::{Op, StreamId};
use crate::pulse::Pulse;
use crate::requests::StreamReader;
use crate::stream_queue::{stream_queue, StreamRx, StreamTx};

/// One session stream's place in the per-connection count, given back on drop.
pub(crate) struct ConnectionSlot {
    counts: ConnectionCounts,
    peer: SocketAddr,
}

/// Session streams open per client connection (by peer address).
pub(crate) type ConnectionCounts = Arc<Mutex<HashMap<SocketAddr, usize>>>;

impl ConnectionSlot {
    /// Counts a new session stream on the peer's connection, refusing it
    /// past `max`; no slot when the transport does not know the peer.
    pub(crate) fn take(
        counts: &ConnectionCounts,
        peer: Option<SocketAddr>,
        max: usize,
    ) -> Result<Option<ConnectionSlot>, Status> {
        let Some(peer) = peer else { return Ok(None) };
        let mut open = counts.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(peer).or_insert(0);
        if *count >= max {
            return Err(Status::resource_exhausted(format!(
                "limit reached: sessions per connection (at most {max})"
            )));
        }
        *count += 1;
        Ok(Some(ConnectionSlot {
            counts: counts.clone(),
            peer,
        }))
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = counts.get_mut(&self.peer) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.peer);
            }
        }
    }
}

/// Client batches forwarded in one poll before the runtime's other tasks
/// get their turn.
pub(crate) const BATCHES_PER_POLL: usize = 16;

/// A session stream the core has: where its messages go and the pulse it
/// shares with the core. The same on a stream of its own ([`SessionReader`])
/// and on a channel of a `Sessions` stream (`crate::session_channels`).
pub(crate) struct Attached {
    pub(crate) stream: StreamId,
    pub(crate) tx: StreamTx,
    pub(crate) pulse: Arc<Pulse>,
}

impl Attached {
    /// Hands `stream`'s first batch to the core: its first message must
    /// open or resume a session; the rest of the batch is left in `batch`,
    /// to be forwarded once attached (the core handles ops in order). The
    /// status that ends the stream otherwise.
    pub(crate) fn open(
        reader: &StreamReader,
        stream: StreamId,
        tx: StreamTx,
        batch: &mut pb::ClientBatch,
    ) -> Result<Attached, Status> {
        let first = if batch.messages.is_empty() {
            None
        } else {
            batch.messages.remove(0).kind
        };
        let pulse = Arc::default();
        let op = reader.opening(stream, first, &tx, &pulse)?;
        reader
            .core
            .send(op)
            .map_err(|_| Status::unavailable("the server is shutting down"))?;
        Ok(Attached { stream, tx, pulse })
    }

    /// Whether the core is done with the stream.
    pub(crate) fn is_ended(&self) -> bool {
        self.pulse.is_ended()
    }

    /// Forwards one client batch, answering what heartbeats it may itself.
    /// False once the stream is over: detached for a message that breaks
    /// the protocol or a client too slow to read, or the core gone.
    pub(crate) fn forward(&self, reader: &StreamReader, mut batch: pb::ClientBatch) -> bool {
        if !self.answer_heartbeats(reader, &mut batch) {
            return false;
        }
        let Some(op) = reader.batch(self.stream, batch) else {
            return true;
        };
        let detach = matches!(op, Op::Detach { .. });
        reader.core.send(op).is_ok() && !detach
    }

    /// Detaches the stream from its session, which lives on by its TTL;
    /// with `error`, the stream ends with it.
    pub(crate) fn detach(&self, reader: &StreamReader, error: Option<Status>) {
        if !self.is_ended() {
            let _ = reader.core.send(Op::Detach {
                stream: self.stream,
                error,
            });
        }
    }

    /// Answers the heartbeats of `batch` that the pulse lets it answer, in
    /// order, and takes them out of it: the rest (and every heartbeat after
    /// one it may not answer) go to the core. False when the client reads
    /// too little to take the answers: the stream is detached with the
    /// reason, as the core does.
    fn answer_heartbeats(&self, reader: &StreamReader, batch: &mut pb::ClientBatch) -> bool {
        let is_heartbeat =
            |m: &pb::ClientMessage| matches!(m.kind, Some(pb::client_message::Kind::Heartbeat(_)));
        if !batch.messages.iter().any(is_heartbeat)
            || !reader.lease.as_ref().is_some_and(|lease| lease.holds())
        {
            return true;
        }
        let mut answers = Vec::new();
        let mut to_core = false;
        batch.messages.retain(|message| {
            if to_core || !is_heartbeat(message) {
                return true;
            }
            match self.pulse.answer() {
                Some(now) => answers.push(convert::heartbeat_ack(now)),
                None => to_core = true,
            }
            to_core
        });
        if answers.is_empty() {
            return true;
        }
        match self.tx.send(pb::ServerBatch { messages: answers }) {
            Ok(()) => true,
            Err(slow) => {
                self.detach(reader, Some(slow.status()));
                false
            }
        }
    }
}

/// The reading side of a session stream: the client's batches in, as ops to
/// the core. Runs as a task of its own ([`SessionReader::spawn`]).
pub(crate) struct SessionReader {
    reader: StreamReader,
    stream: StreamId,
    /// The client's batches, until reading is over.
    inbound: Option<Streaming<pb::ClientBatch>>,
    reading: Reading,
    /// The stream's place in its connection's count, given back with it.
    _slot: Option<ConnectionSlot>,
}

/// Where the reading side is.
enum Reading {
    /// Waiting for the message that opens or resumes the session, until the
    /// deadline; the stream's sending end waits here until the core has it.
    Opening {
        tx: StreamTx,
        deadline: Pin<Box<Sleep>>,
    },
    /// The core has the stream; it ends the pulse when it is done with it.
    Attached(Attached),
    /// Nothing more is read.
    Over,
}

impl SessionReader {
    /// Starts reading `inbound`, which must open or resume a session within
    /// `open_timeout`, on a task of its own; returns the stream's outbound
    /// side, the response the transport writes.
    pub(crate) fn spawn(
        reader: StreamReader,
        stream: StreamId,
        inbound: Streaming<pb::ClientBatch>,
        max_backlog: usize,
        open_timeout: Duration,
        slot: Option<ConnectionSlot>,
    ) -> StreamRx {
        let (tx, outbound) = stream_queue(max_backlog);
        tokio::spawn(SessionReader {
            reader,
            stream,
            inbound: Some(inbound),
            reading: Reading::Opening {
                tx,
                deadline: Box::pin(tokio::time::sleep(open_timeout)),
            },
            _slot: slot,
        });
        outbound
    }

    /// Forwards what the client has sent, up to [`BATCHES_PER_POLL`]
    /// batches, and registers for more; ready once reading is over.
    fn read(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        for _ in 0..BATCHES_PER_POLL {
            match &mut self.reading {
                Reading::Over => return Poll::Ready(()),
                Reading::Opening { tx, deadline } => {
                    if deadline.as_mut().poll(cx).is_ready() {
                        tx.end(Status::deadline_exceeded(
                            "no open or resume message in time",
                        ));
                        self.stop();
                        continue;
                    }
                }
                Reading::Attached(attached) => {
                    if attached.is_ended() {
                        self.stop();
                        continue;
                    }
                }
            }
            let Some(inbound) = self.inbound.as_mut() else {
                return Poll::Ready(());
            };
            match Pin::new(inbound).poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(batch))) => self.take(batch),
                // The client ended its side, or a batch does not decode (too
                // large, malformed): the stream ends, with the reason if any.
                Poll::Ready(end) => {
                    if let Reading::Attached(attached) = &self.reading {
                        attached.detach(&self.reader, end.and_then(Result::err));
                    }
                    self.stop();
                }
            }
        }
        // More may be waiting: come back after the runtime's other work.
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// Forwards one client batch.
    fn take(&mut self, mut batch: pb::ClientBatch) {
        if let Reading::Opening { tx, .. } = &self.reading {
            match Attached::open(&self.reader, self.stream, tx.clone(), &mut batch) {
                Ok(attached) => self.reading = Reading::Attached(attached),
                Err(status) => {
                    tx.end(status);
                    return self.stop();
                }
            }
        }
        if let Reading::Attached(attached) = &self.reading {
            if !attached.forward(&self.reader, batch) {
                self.stop();
            }
        }
    }

    /// Reads no more; the stream ends once the core is done with it (at
    /// once, if the core never had it: the sending end goes here).
    fn stop(&mut self) {
        self.inbound = None;
        self.reading = Reading::Over;
    }
}

/// Cancel safety: a reader dropped while attached (the runtime stopping)
/// detaches its stream; the session lives on by its TTL.
impl Future for SessionReader {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.read(cx)
    }
}

impl Drop for SessionReader {
    /// Dropped while attached (the runtime stopping): the core detaches the
    /// stream now, and the session lives on by its TTL.
    fn drop(&mut self) {
        if let Reading::Attached(attached) = &self.reading {
            attached.detach(&self.reader, None);
        }
    }
}

#[cfg(test)]
mod tests {
    /// Every session keeps its reader for as long as it lives, idle or not:
    /// it must stay a few fields, not the state of every await point.
    #[test]
    fn a_reader_is_a_few_hundred_bytes() {
        let size = std::mem::size_of::<super::SessionReader>();
        println!("a session's reader: {size} bytes");
        assert!(size <= 512, "a session's reader is {size} bytes");
    }
}
