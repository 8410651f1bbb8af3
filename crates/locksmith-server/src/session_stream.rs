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
use tonic::Status;

use crate::convert;
use crate::op::{Op, StreamId};
use crate::pulse::Pulse;
use crate::requests::StreamReader;
use crate::stream_queue::{stream_queue, StreamRx, StreamTx};

/// A stream's places in the per-connection count of sessions (one for a
/// session stream, one per channel of a `Sessions` stream), given back on
/// drop.
pub(crate) struct ConnectionSlot {
    counts: ConnectionCounts,
    peer: SocketAddr,
    held: usize,
}

/// Sessions open per client connection (by peer address).
pub(crate) type ConnectionCounts = Arc<Mutex<HashMap<SocketAddr, usize>>>;

/// What a client past the sessions allowed per connection is told.
pub(crate) fn too_many_on_connection(max: usize) -> Status {
    Status::resource_exhausted(format!(
        "limit reached: sessions per connection (at most {max})"
    ))
}

impl ConnectionSlot {
    /// Counts a new session stream on the peer's connection, refusing it
    /// past `max`; no slot when the transport does not know the peer.
    pub(crate) fn take(
        counts: &ConnectionCounts,
        peer: Option<SocketAddr>,
        max: usize,
    ) -> Result<Option<ConnectionSlot>, Status> {
        let Some(mut slot) = ConnectionSlot::empty(counts, peer) else {
            return Ok(None);
        };
        slot.hold(1, max)?;
        Ok(Some(slot))
    }

    /// A slot on the peer's connection that holds no place yet; none when
    /// the transport does not know the peer.
    pub(crate) fn empty(counts: &ConnectionCounts, peer: Option<SocketAddr>) -> Option<Self> {
        Some(ConnectionSlot {
            counts: counts.clone(),
            peer: peer?,
            held: 0,
        })
    }

    /// Holds `places` places instead of those it holds now, refusing to
    /// grow past `max` on the connection.
    pub(crate) fn hold(&mut self, places: usize, max: usize) -> Result<(), Status> {
        let mut open = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(self.peer).or_insert(0);
        let others = *count - self.held;
        if places > self.held && others + places > max {
            return Err(too_many_on_connection(max));
        }
        *count = others + places;
        self.held = places;
        if *count == 0 {
            open.remove(&self.peer);
        }
        Ok(())
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let _ = self.hold(0, 0);
    }
}

/// Client batches forwarded in one poll before the runtime's other tasks
/// get their turn.
pub(crate) const BATCHES_PER_POLL: usize = 16;

/// A session stream the core has, as its reader knows it: its id and the
/// pulse it shares with the core (where its messages go is the reader's:
/// a stream's own sender, or one made for a channel when needed). The same
/// on a stream of its own ([`SessionReader`]) and on a channel of a
/// `Sessions` stream (`crate::session_channels`).
pub(crate) struct Attached {
    pub(crate) stream: StreamId,
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
        tx: &StreamTx,
        batch: &mut pb::ClientBatch,
    ) -> Result<Attached, Status> {
        let first = if batch.messages.is_empty() {
            None
        } else {
            batch.messages.remove(0).kind
        };
        let pulse = Arc::default();
        let op = reader.opening(stream, first, tx, &pulse)?;
        reader
            .core
            .send(op)
            .map_err(|_| Status::unavailable("the server is shutting down"))?;
        Ok(Attached { stream, pulse })
    }

    /// Whether the core is done with the stream.
    pub(crate) fn is_ended(&self) -> bool {
        self.pulse.is_ended()
    }

    /// Forwards one client batch, answering on `tx` what heartbeats it may
    /// itself. False once the stream is over: detached for a message that
    /// breaks the protocol or a client too slow to read, or the core gone.
    pub(crate) fn forward(
        &self,
        reader: &StreamReader,
        tx: impl FnOnce() -> StreamTx,
        mut batch: pb::ClientBatch,
    ) -> bool {
        if !self.answer_heartbeats(reader, tx, &mut batch) {
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
    fn answer_heartbeats(
        &self,
        reader: &StreamReader,
        tx: impl FnOnce() -> StreamTx,
        batch: &mut pb::ClientBatch,
    ) -> bool {
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
        match tx().send(pb::ServerBatch { messages: answers }) {
            Ok(()) => true,
            Err(slow) => {
                self.detach(reader, Some(slow.status()));
                false
            }
        }
    }
}

/// The client's batches of one session stream, from the gRPC call or a
/// framed connection (module `framed_session`); an error ends the stream
/// with it.
pub(crate) type ClientBatches = Pin<Box<dyn Stream<Item = Result<pb::ClientBatch, Status>> + Send>>;

/// The reading side of a session stream: the client's batches in, as ops to
/// the core. Runs as a task of its own ([`SessionReader::spawn`]).
pub(crate) struct SessionReader {
    reader: StreamReader,
    stream: StreamId,
    /// The client's batches, until reading is over.
    inbound: Option<ClientBatches>,
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
    /// The reader answers heartbeats on `tx`.
    Attached { attached: Attached, tx: StreamTx },
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
        inbound: ClientBatches,
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
                Reading::Attached { attached, .. } => {
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
                    if let Reading::Attached { attached, .. } = &self.reading {
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
            match Attached::open(&self.reader, self.stream, tx, &mut batch) {
                Ok(attached) => {
                    self.reading = Reading::Attached {
                        attached,
                        tx: tx.clone(),
                    }
                }
                Err(status) => {
                    tx.end(status);
                    return self.stop();
                }
            }
        }
        if let Reading::Attached { attached, tx } = &self.reading {
            if !attached.forward(&self.reader, || tx.clone(), batch) {
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
        if let Reading::Attached { attached, .. } = &self.reading {
            attached.detach(&self.reader, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream's places count against its connection's sessions, grow
    /// only within the limit, and all go back when it goes.
    #[test]
    fn a_streams_places_count_on_its_connection_and_go_back_with_it() {
        let counts = ConnectionCounts::default();
        let peer = Some("127.0.0.1:4000".parse().expect("an address"));
        let mut channels = ConnectionSlot::empty(&counts, peer).expect("a known peer");
        channels.hold(3, 4).expect("within the limit");
        let single = ConnectionSlot::take(&counts, peer, 4).expect("the fourth place");
        assert!(ConnectionSlot::take(&counts, peer, 4).is_err(), "a fifth");
        assert!(channels.hold(4, 4).is_err(), "no room to grow");
        channels.hold(1, 4).expect("shrinking always works");
        assert!(
            ConnectionSlot::take(&counts, peer, 4).is_ok(),
            "a place went back"
        );
        drop((channels, single));
        assert!(counts.lock().unwrap().is_empty(), "every place given back");
        assert!(ConnectionSlot::take(&counts, None, 0)
            .expect("unknown")
            .is_none());
    }

    /// Every session keeps its reader for as long as it lives, idle or not:
    /// it must stay a few fields, not the state of every await point.
    #[test]
    fn a_reader_is_a_few_hundred_bytes() {
        let size = std::mem::size_of::<super::SessionReader>();
        println!("a session's reader: {size} bytes");
        assert!(size <= 512, "a session's reader is {size} bytes");
    }
}
