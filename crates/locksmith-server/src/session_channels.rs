//! The reading side of a `Sessions` stream: many sessions on one stream,
//! each on a channel the client numbers.
//!
//! Every channel is, to the core, a session stream like any other (an id of
//! its own, a sender, a pulse: [`Attached`]); only the transport is shared.
//! That is the point: an idle session on a stream of its own costs the
//! server about 2 KiB for the stream (its HTTP/2 state, hyper's and tonic's
//! tasks and buffers, its reader task), and each of its heartbeats three task
//! wake-ups and two system calls; on a channel it costs an entry in this
//! reader's map, and the heartbeats of all the channels that a client sends
//! together are read, answered and written together.
//!
//! The rules are the session stream's, per channel: a channel's first batch
//! opens or resumes its session, a batch that breaks the protocol ends that
//! channel only, a client too slow to read has each channel ended as it gets
//! something to send. Channel numbers only grow, so that nothing meant for an
//! ended channel is ever taken for a new one's.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Future, Stream};
use locksmith_proto::v1 as pb;
use tokio::time::{Instant, Sleep};
use tonic::{Status, Streaming};

use crate::requests::StreamReader;
use crate::session_stream::{
    too_many_on_connection, Attached, ConnectionCounts, ConnectionSlot, BATCHES_PER_POLL,
};
use crate::stream_queue::{channels_queue, ChannelsRx, StreamTx};

/// Where a `Sessions` stream's channels are counted against the sessions
/// allowed per client connection.
pub(crate) struct ChannelSlots {
    pub(crate) counts: ConnectionCounts,
    pub(crate) peer: Option<SocketAddr>,
    pub(crate) max: usize,
}

/// The reading side of a `Sessions` stream. Runs as a task of its own
/// ([`ChannelsReader::spawn`]).
pub(crate) struct ChannelsReader {
    reader: StreamReader,
    /// Where the channels' stream ids come from (the service's count).
    stream_ids: Arc<AtomicU64>,
    /// The client's messages, until reading is over.
    inbound: Option<Streaming<pb::ClientChannelBatches>>,
    /// The stream's own sender: each channel's is made from it, and it ends
    /// the stream as a whole.
    tx: StreamTx,
    /// The channels read so far, by number, each a session stream (its
    /// sender is made from the stream's when needed, so that an idle
    /// session keeps two words here); an ended one stays until the next
    /// sweep.
    channels: HashMap<u64, Attached>,
    /// The highest channel number used on the stream.
    highest: Option<u64>,
    /// The channels' places in the connection's count: one per channel.
    places: Option<ConnectionSlot>,
    /// Most sessions on the connection, and so on this stream.
    max_channels: usize,
    /// When ended channels are swept out, and a stream without a session
    /// ended.
    sweep: Pin<Box<Sleep>>,
    open_timeout: Duration,
    /// The last sweep found no session and none had opened since the one
    /// before (true from the start: a stream must open one in time).
    idle: bool,
    /// A channel opened since the last sweep.
    opened: bool,
}

impl ChannelsReader {
    /// Starts reading `inbound` on a task of its own; returns the stream's
    /// outbound side, the response the transport writes.
    pub(crate) fn spawn(
        reader: StreamReader,
        stream_ids: Arc<AtomicU64>,
        inbound: Streaming<pb::ClientChannelBatches>,
        max_backlog: usize,
        open_timeout: Duration,
        slots: ChannelSlots,
    ) -> ChannelsRx {
        let (tx, outbound) = channels_queue(max_backlog);
        tokio::spawn(ChannelsReader {
            reader,
            stream_ids,
            inbound: Some(inbound),
            tx,
            channels: HashMap::new(),
            highest: None,
            places: ConnectionSlot::empty(&slots.counts, slots.peer),
            max_channels: slots.max,
            sweep: Box::pin(tokio::time::sleep(open_timeout)),
            open_timeout,
            idle: true,
            opened: false,
        });
        outbound
    }

    /// Forwards what the client has sent, up to [`BATCHES_PER_POLL`]
    /// messages, then sweeps if it is time (after reading, so that a
    /// session that has arrived counts), and registers for more; ready once
    /// reading is over.
    fn read(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        for _ in 0..BATCHES_PER_POLL {
            let Some(inbound) = self.inbound.as_mut() else {
                return Poll::Ready(());
            };
            match Pin::new(inbound).poll_next(cx) {
                Poll::Pending => return self.sweep_when_due(cx),
                Poll::Ready(Some(Ok(message))) => {
                    for batch in message.batches {
                        if self.inbound.is_none() {
                            break;
                        }
                        self.take(batch);
                    }
                }
                // The client ended its side: every channel is detached and
                // the stream ends once the core lets go of them. A message
                // that does not decode (too large, malformed) ends the stream
                // with the reason.
                Poll::Ready(end) => {
                    if let Some(status) = end.and_then(Result::err) {
                        self.tx.end(status);
                    }
                    self.stop();
                }
            }
        }
        // More may be waiting: come back after the runtime's other work.
        cx.waker().wake_by_ref();
        self.sweep_when_due(cx)
    }

    /// Sweeps when the sweep is due, and ends a stream that has carried no
    /// session since the sweep before; each sweep sets the next, which is
    /// polled to be woken for it.
    fn sweep_when_due(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        while self.inbound.is_some() && self.sweep.as_mut().poll(cx).is_ready() {
            if !self.swept() {
                self.tx.end(Status::deadline_exceeded(format!(
                    "no session on this stream for {} ms",
                    self.open_timeout.as_millis()
                )));
                self.stop();
            }
        }
        if self.inbound.is_none() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    /// Sweeps out the channels the core is done with; false when the stream
    /// has carried no session since the sweep before (it is to end).
    fn swept(&mut self) -> bool {
        self.forget_ended();
        let idle = self.channels.is_empty() && !self.opened;
        if idle && self.idle {
            return false;
        }
        self.idle = idle;
        self.opened = false;
        let next = Instant::now() + self.open_timeout;
        self.sweep.as_mut().reset(next);
        true
    }

    /// Forwards one channel's batch: to its session stream, or, for a new
    /// channel, to open or resume one.
    fn take(&mut self, message: pb::ClientChannelBatch) {
        let number = message.channel;
        let batch = message.batch.unwrap_or_default();
        if let Some(attached) = self.channels.get(&number) {
            if attached.is_ended() {
                self.forget(number);
                return self.refuse(number, "the channel has ended");
            }
            let open = attached.forward(&self.reader, || self.tx.channel(number), batch);
            if open && message.done {
                attached.detach(&self.reader, None);
            }
            if !open || message.done {
                self.forget(number);
            }
            return;
        }
        if self.highest.is_some_and(|highest| number <= highest) {
            return self.refuse(
                number,
                "the channel is not open: a new channel's number is above every one used before",
            );
        }
        self.highest = Some(number);
        self.open(number, batch, message.done);
    }

    /// Opens channel `number` with its first batch.
    fn open(&mut self, number: u64, mut batch: pb::ClientBatch, done: bool) {
        let tx = self.tx.channel(number);
        // The ended channels not swept yet give their places back first if
        // there is none left.
        let places = self.channels.len() + 1;
        if self.hold(places).is_err() {
            self.forget_ended();
        }
        if let Err(status) = self.hold(self.channels.len() + 1) {
            return self.end_channel(&tx, status);
        }
        let stream = self.stream_ids.fetch_add(1, Ordering::Relaxed);
        let opened = Attached::open(&self.reader, stream, &tx, &mut batch).map(|attached| {
            (
                attached.forward(&self.reader, || tx.clone(), batch),
                attached,
            )
        });
        match opened {
            Ok((true, attached)) if !done => {
                self.opened = true;
                self.channels.insert(number, attached);
            }
            Ok((true, attached)) => {
                self.opened = true;
                attached.detach(&self.reader, None);
            }
            Ok((false, _)) => self.opened = true,
            Err(status) => self.end_channel(&tx, status),
        }
        self.give_back_places();
    }

    /// Holds `places` places in the connection's count (and on this stream,
    /// for a transport that does not tell the client's address).
    fn hold(&mut self, places: usize) -> Result<(), Status> {
        if places > self.max_channels {
            return Err(too_many_on_connection(self.max_channels));
        }
        match &mut self.places {
            Some(slot) => slot.hold(places, self.max_channels),
            None => Ok(()),
        }
    }

    /// Gives back the places of channels no longer kept.
    fn give_back_places(&mut self) {
        let kept = self.channels.len();
        if let Some(slot) = &mut self.places {
            let _ = slot.hold(kept, self.max_channels);
        }
    }

    /// Forgets channel `number`, and gives back its place.
    fn forget(&mut self, number: u64) {
        self.channels.remove(&number);
        self.give_back_places();
    }

    /// Forgets the channels the core is done with, and gives back their places.
    fn forget_ended(&mut self) {
        self.channels.retain(|_, attached| !attached.is_ended());
        self.give_back_places();
    }

    /// Ends channel `number` for a batch that cannot run; nothing of it does.
    fn refuse(&mut self, number: u64, why: &str) {
        let status = Status::failed_precondition(format!("channel {number}: {why}"));
        let tx = self.tx.channel(number);
        self.end_channel(&tx, status);
    }

    /// Ends a channel the core does not have with `status`, unless the
    /// client has left too much unread: then the whole stream ends, so that
    /// a client that sends without reading cannot queue ends without bound.
    fn end_channel(&mut self, tx: &StreamTx, status: Status) {
        match tx.too_slow() {
            None => tx.end(status),
            Some(slow) => {
                self.tx.end(slow.status());
                self.stop();
            }
        }
    }

    /// Reads no more, and detaches the channels; the stream ends once the
    /// core is done with them.
    fn stop(&mut self) {
        self.inbound = None;
        for (_, attached) in self.channels.drain() {
            attached.detach(&self.reader, None);
        }
        self.give_back_places();
    }
}

/// Cancel safety: a reader dropped while channels are attached (the
/// runtime stopping) detaches them; their sessions live on by their TTL.
impl Future for ChannelsReader {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.read(cx)
    }
}

impl Drop for ChannelsReader {
    /// Dropped with channels attached (the runtime stopping): the core
    /// detaches them now, and their sessions live on by their TTL.
    fn drop(&mut self) {
        for attached in self.channels.values() {
            attached.detach(&self.reader, None);
        }
    }
}
