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

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::channel::mpsc;
use locksmith_proto::prost::Message;
use locksmith_proto::v1 as pb;
use tokio_stream::Stream;
use tonic::Status;

type Item = (usize, Result<pb::ServerBatch, Status>);

/// A new stream's queue: the core's end and the transport's end.
pub(crate) fn stream_queue(limit_bytes: usize) -> (StreamTx, StreamRx) {
    let (tx, rx) = mpsc::unbounded();
    let backlog = Arc::new(AtomicUsize::new(0));
    let sender = StreamTx {
        tx,
        backlog: backlog.clone(),
        limit_bytes,
    };
    (sender, StreamRx { rx, backlog })
}

/// Where a session stream's messages go.
#[derive(Clone, Debug)]
pub(crate) struct StreamTx {
    tx: mpsc::UnboundedSender<Item>,
    /// Encoded bytes queued and not yet taken by the transport.
    backlog: Arc<AtomicUsize>,
    limit_bytes: usize,
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
    /// Queues `batch` unless the client's unread backlog is already past the
    /// limit. A stream whose client went away takes anything (and drops it).
    pub(crate) fn send(&self, batch: pb::ServerBatch) -> Result<(), TooSlow> {
        let backlog = self.backlog.load(Ordering::Relaxed);
        if backlog > self.limit_bytes {
            return Err(TooSlow {
                backlog,
                limit: self.limit_bytes,
            });
        }
        let bytes = batch.encoded_len();
        self.backlog.fetch_add(bytes, Ordering::Relaxed);
        let _ = self.tx.unbounded_send((bytes, Ok(batch)));
        Ok(())
    }

    /// Ends the stream with `status` after what is queued.
    pub(crate) fn end(&self, status: Status) {
        let _ = self.tx.unbounded_send((0, Err(status)));
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
            item.map(|(bytes, batch)| {
                self.backlog.fetch_sub(bytes, Ordering::Relaxed);
                batch
            })
        })
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
}
