//! The outbound queue of one session stream, bounded by what its client has
//! not read.
//!
//! The core never waits for a client: it queues a stream's batches and goes
//! on. A client that sends requests but never reads its replies would make
//! that queue grow without end, so the queue counts the encoded bytes its
//! client has not taken yet. A batch is queued only while that backlog is
//! within the limit; past it, the stream is ended with a clear reason
//! (`RESOURCE_EXHAUSTED`) and the core detaches it. The session lives on by
//! the normal rules: its client may resume it on a new stream within its TTL,
//! re-send what is unanswered and get the kept replies.
//!
//! The check is made before a batch, not after it: one engine batch always
//! reaches a client that keeps up (a force-release of a million holds makes
//! a million lost notices in one go), so a stream holds at most the limit
//! plus one engine batch's messages.
//!
//! Written here rather than with a bounded channel: a full bounded channel
//! could not carry the status that says why the stream ends, and the limit is
//! in bytes, not in messages. The channel under it is `futures`' unbounded
//! one, which allocates per message queued: tokio's allocates a block of 32
//! slots up front, about a kilobyte for every idle stream.
//!
//! The sessions of a `Sessions` stream each have a channel on it: their
//! senders share the stream's one queue and backlog, and tag what they send
//! with the channel ([`StreamTx::channel`]), so that an idle session costs a
//! sender's few words, and the transport's end ([`ChannelsRx`]) sends
//! whatever every channel has queued as one message.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::channel::mpsc;
use locksmith_proto::prost::Message;
use locksmith_proto::v1 as pb;
use tokio_stream::Stream;
use tonic::Status;

/// What is queued: its encoded size, the channel it is for (none on a
/// stream of one session, and for the end of a `Sessions` stream as a
/// whole), and the batch or the status that ends the stream or channel.
type Item = (usize, Option<u64>, Result<pb::ServerBatch, Status>);

/// A new stream's queue: the core's end and the transport's end.
pub(crate) fn stream_queue(limit_bytes: usize) -> (StreamTx, StreamRx) {
    let (tx, rx) = mpsc::unbounded();
    let backlog = Arc::new(AtomicUsize::new(0));
    let sender = StreamTx {
        tx,
        backlog: backlog.clone(),
        limit_bytes,
        channel: None,
    };
    (sender, StreamRx { rx, backlog })
}

/// A `Sessions` stream's queue: the stream's own end (for its end as a
/// whole, and to make each channel's sender with [`StreamTx::channel`]) and
/// the transport's end.
pub(crate) fn channels_queue(limit_bytes: usize) -> (StreamTx, ChannelsRx) {
    let (tx, StreamRx { rx, backlog }) = stream_queue(limit_bytes);
    (
        tx,
        ChannelsRx {
            rx,
            backlog,
            end: None,
        },
    )
}

/// What an end counts in the backlog besides its message: at most its
/// channel number, status code and their framing, encoded.
const END_BYTES: usize = 32;

/// Where a session stream's messages go.
#[derive(Clone, Debug)]
pub(crate) struct StreamTx {
    tx: mpsc::UnboundedSender<Item>,
    /// Encoded bytes queued and not yet taken by the transport.
    backlog: Arc<AtomicUsize>,
    limit_bytes: usize,
    /// The channel of a `Sessions` stream this sender is for.
    channel: Option<u64>,
}

/// The stream's client has more unread than the limit allows.
#[derive(Debug)]
pub(crate) struct TooSlow {
    /// Unread bytes when the batch came.
    pub backlog: usize,
    /// The limit.
    pub limit: usize,
}

impl TooSlow {
    /// What the client is told when its stream is ended for it.
    pub(crate) fn status(&self) -> Status {
        Status::resource_exhausted(format!(
            "client too slow to read: {} bytes of replies unread (at most {}); \
             the stream is closed, resume the session on a new one",
            self.backlog, self.limit
        ))
    }
}

impl StreamTx {
    /// A sender for `channel` of the same `Sessions` stream, on its queue
    /// and within its backlog.
    pub(crate) fn channel(&self, channel: u64) -> StreamTx {
        StreamTx {
            channel: Some(channel),
            ..self.clone()
        }
    }

    /// Queues `batch` unless the client's unread backlog is already past the
    /// limit. A stream whose client went away takes anything (and drops it).
    pub(crate) fn send(&self, batch: pb::ServerBatch) -> Result<(), TooSlow> {
        self.too_slow().map_or(Ok(()), Err)?;
        let bytes = batch.encoded_len();
        self.backlog.fetch_add(bytes, Ordering::Relaxed);
        let _ = self.tx.unbounded_send((bytes, self.channel, Ok(batch)));
        Ok(())
    }

    /// Whether the client's unread backlog is past the limit.
    pub(crate) fn too_slow(&self) -> Option<TooSlow> {
        let backlog = self.backlog.load(Ordering::Relaxed);
        (backlog > self.limit_bytes).then_some(TooSlow {
            backlog,
            limit: self.limit_bytes,
        })
    }

    /// Ends the stream (or the channel) with `status` after what is queued.
    /// It counts in the backlog like a batch: a `Sessions` stream's client
    /// can have many channels ended, and must read of those too.
    pub(crate) fn end(&self, status: Status) {
        let bytes = status.message().len() + END_BYTES;
        self.backlog.fetch_add(bytes, Ordering::Relaxed);
        let _ = self.tx.unbounded_send((bytes, self.channel, Err(status)));
    }
}

/// The transport's end of a stream's queue: every batch it takes lowers the
/// backlog.
pub(crate) struct StreamRx {
    rx: mpsc::UnboundedReceiver<Item>,
    backlog: Arc<AtomicUsize>,
}

impl Stream for StreamRx {
    type Item = Result<pb::ServerBatch, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.rx).poll_next(cx).map(|item| {
            item.map(|(bytes, _, batch)| {
                self.backlog.fetch_sub(bytes, Ordering::Relaxed);
                batch
            })
        })
    }
}

/// Most encoded bytes [`ChannelsRx`] gathers into one message before it
/// sends it: its batches come from the core in pieces of a few hundred KiB
/// at most (the outbox's limit), and a gRPC client decodes 4 MiB by
/// default, so a message stays well under that.
const CHANNELS_MESSAGE_BYTES: usize = 1 << 20;

/// The transport's end of a `Sessions` stream's queue: everything its
/// channels have queued, as one message (up to [`CHANNELS_MESSAGE_BYTES`]).
pub(crate) struct ChannelsRx {
    rx: mpsc::UnboundedReceiver<Item>,
    backlog: Arc<AtomicUsize>,
    /// The stream's own end, taken after the batches queued before it.
    end: Option<Status>,
}

impl ChannelsRx {
    /// One channel's batch or end, as the stream carries it.
    fn tagged(channel: u64, batch: Result<pb::ServerBatch, Status>) -> pb::ServerChannelBatch {
        match batch {
            Ok(batch) => pb::ServerChannelBatch {
                channel,
                batch: Some(batch),
                end: None,
            },
            Err(status) => pb::ServerChannelBatch {
                channel,
                batch: None,
                end: Some(pb::ChannelEnd {
                    code: status.code() as i32,
                    message: status.message().to_owned(),
                }),
            },
        }
    }
}

impl Stream for ChannelsRx {
    type Item = Result<pb::ServerChannelBatches, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(status) = self.end.take() {
            return Poll::Ready(Some(Err(status)));
        }
        let mut batches = Vec::new();
        let mut bytes = 0;
        while bytes < CHANNELS_MESSAGE_BYTES {
            let (size, channel, batch) = match Pin::new(&mut self.rx).poll_next(cx) {
                Poll::Ready(Some(item)) => item,
                Poll::Ready(None) | Poll::Pending if !batches.is_empty() => break,
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            };
            self.backlog.fetch_sub(size, Ordering::Relaxed);
            match (channel, batch) {
                (Some(channel), batch) => {
                    let tagged = ChannelsRx::tagged(channel, batch);
                    // (With the field's key and length, at most 6 bytes.)
                    bytes += tagged.encoded_len() + 6;
                    batches.push(tagged);
                }
                // The stream's own end, once what came before it has gone.
                (None, Err(status)) if batches.is_empty() => {
                    return Poll::Ready(Some(Err(status)));
                }
                (None, Err(status)) => {
                    self.end = Some(status);
                    break;
                }
                // The stream's own sender sends no batch of its own.
                (None, Ok(_)) => {}
            }
        }
        Poll::Ready(Some(Ok(pb::ServerChannelBatches { batches })))
    }
}

#[cfg(test)]
mod tests {
    use tokio_stream::StreamExt;

    use super::*;

    fn batch(messages: usize) -> pb::ServerBatch {
        let reply = pb::ServerMessage {
            kind: Some(pb::server_message::Kind::Ended(pb::SessionEnded {
                reason: "x".repeat(100),
            })),
        };
        pb::ServerBatch {
            messages: vec![reply; messages],
        }
    }

    #[tokio::test]
    async fn refuses_a_batch_only_once_the_unread_backlog_is_past_the_limit() {
        let (tx, mut rx) = stream_queue(1000);
        // One batch larger than the limit still goes: the check is before it.
        tx.send(batch(20)).expect("an empty queue takes any batch");
        let refused = tx.send(batch(1)).expect_err("past the limit");
        assert!(refused.backlog > 1000);
        assert_eq!(refused.status().code(), tonic::Code::ResourceExhausted);
        // Once the client reads, the queue takes batches again.
        rx.next().await.expect("queued").expect("a batch");
        tx.send(batch(1)).expect("the backlog was read");
        tx.end(Status::aborted("done"));
        assert_eq!(
            rx.next()
                .await
                .expect("queued")
                .expect("a batch")
                .messages
                .len(),
            1
        );
        let end = rx.next().await.expect("queued").expect_err("the end");
        assert_eq!(end.code(), tonic::Code::Aborted);
    }

    /// However much its channels have queued, a `Sessions` stream sends it
    /// in messages a client can decode, in order, with the stream's own end
    /// after them.
    #[tokio::test]
    async fn a_sessions_stream_gathers_its_channels_into_messages_of_bounded_size() {
        let (tx, mut rx) = channels_queue(usize::MAX);
        for channel in 1..=200_000 {
            tx.channel(channel)
                .end(Status::failed_precondition("refused"));
        }
        tx.channel(7).send(batch(3)).expect("no limit");
        tx.end(Status::aborted("done"));
        drop(tx);
        let mut channels = Vec::new();
        let end = loop {
            match rx.next().await.expect("the stream's end comes last") {
                Ok(message) => {
                    let size = message.encoded_len();
                    assert!(size <= CHANNELS_MESSAGE_BYTES + 1024, "{size} bytes");
                    channels.extend(message.batches.iter().map(|b| b.channel));
                }
                Err(status) => break status,
            }
        };
        assert_eq!(end.code(), tonic::Code::Aborted);
        assert_eq!(channels.len(), 200_001);
        assert!(
            channels[..200_000].iter().copied().eq(1..=200_000),
            "in order"
        );
        assert_eq!(channels[200_000], 7);
    }
}
