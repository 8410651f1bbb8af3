//! What one engine batch sends: held until the batch's log records are
//! durable, then sent as **one [`pb::ServerBatch`] per stream**, plus the
//! replies of unary calls.
//!
//! Grouping by stream is what makes a multiplexed client cheap: 64 requests
//! answered in one engine batch reach their stream as one channel send, one
//! wake-up of the stream's task and one HTTP/2 message, not 64 of each.

use std::collections::HashMap;

use locksmith_proto::v1 as pb;
use tonic::Status;

use crate::op::{StreamId, UnaryReply};
use crate::stream_queue::{StreamTx, TooSlow};

/// Most messages in one [`pb::ServerBatch`]: well under the 4 MiB a gRPC
/// client decodes by default, with the largest messages (lost notices with
/// 512-byte names and 256-byte owners).
pub(crate) const MAX_MESSAGES_PER_BATCH: usize = 4096;

/// Everything one engine batch sends once its records are durable.
#[derive(Default)]
pub(crate) struct Output {
    /// Messages for the session streams.
    pub streams: Outbox,
    /// Replies of unary calls.
    pub unary: Vec<Box<dyn FnOnce() + Send>>,
    /// Sessionless grants (a grant nobody receives must be released again).
    pub lease_grants: Vec<(LeaseWaiter, Vec<u64>)>,
}

/// A sessionless acquire waiting for its outcome.
pub(crate) struct LeaseWaiter {
    pub reply: UnaryReply<pb::AcquireLeaseResponse>,
    pub names: Vec<String>,
    pub owner: String,
}

/// A sessionless grant nobody received: the core releases it again.
pub(crate) struct Orphan {
    pub names: Vec<String>,
    pub owner: String,
    pub tokens: Vec<u64>,
}

impl Output {
    /// Sends everything, in the order it was made; sessionless grants whose
    /// caller went away go to `orphans`. Returns the streams that were ended
    /// because their client does not read (the core detaches them).
    pub(crate) fn send(self, orphans: &mut Vec<Orphan>) -> Vec<(StreamId, TooSlow)> {
        let too_slow = self.streams.send();
        for reply in self.unary {
            reply();
        }
        for (waiter, tokens) in self.lease_grants {
            let response = pb::AcquireLeaseResponse {
                granted: true,
                tokens: tokens.clone(),
                timed_out: false,
            };
            if waiter.reply.send(Ok(response)).is_err() {
                orphans.push(Orphan {
                    names: waiter.names,
                    owner: waiter.owner,
                    tokens,
                });
            }
        }
        too_slow
    }
}

/// The messages of one engine batch, per stream, in the order they were made.
#[derive(Default)]
pub(crate) struct Outbox {
    /// Streams in the order they first got a message.
    pending: Vec<Pending>,
    /// Where each stream's entry is in `pending`.
    index: HashMap<StreamId, usize>,
}

struct Pending {
    id: StreamId,
    tx: StreamTx,
    messages: Vec<pb::ServerMessage>,
    /// Ends the stream with this status after the messages.
    end: Option<Status>,
}

impl Outbox {
    fn entry(&mut self, stream: StreamId, tx: &StreamTx) -> &mut Pending {
        let at = *self.index.entry(stream).or_insert_with(|| {
            self.pending.push(Pending {
                id: stream,
                tx: tx.clone(),
                messages: Vec::new(),
                end: None,
            });
            self.pending.len() - 1
        });
        &mut self.pending[at]
    }

    /// Queues `message` for `stream`.
    pub(crate) fn push(&mut self, stream: StreamId, tx: &StreamTx, message: pb::ServerMessage) {
        self.entry(stream, tx).messages.push(message);
    }

    /// The status `stream` is to end with, if it is to end.
    #[cfg(test)]
    pub(crate) fn end_of(&self, stream: StreamId) -> Option<&Status> {
        let &at = self.index.get(&stream)?;
        self.pending[at].end.as_ref()
    }

    /// The messages queued for `stream`.
    #[cfg(test)]
    pub(crate) fn messages(&self, stream: StreamId) -> &[pb::ServerMessage] {
        self.index
            .get(&stream)
            .map_or(&[], |&at| &self.pending[at].messages)
    }

    /// Ends `stream` with `status` once its queued messages are sent.
    pub(crate) fn end(&mut self, stream: StreamId, tx: &StreamTx, status: Status) {
        self.entry(stream, tx).end = Some(status);
    }

    /// Sends every stream its batch (and its end, if any); a stream whose
    /// client is too slow to read gets its end instead, and is returned.
    fn send(self) -> Vec<(StreamId, TooSlow)> {
        let mut too_slow = Vec::new();
        'streams: for mut pending in self.pending {
            // One command can make many messages (closing a session with a
            // million holds makes a million lost notices): they go out in
            // batches a client can decode, at most a few hundred KiB each.
            while !pending.messages.is_empty() {
                let rest = pending
                    .messages
                    .split_off(pending.messages.len().min(MAX_MESSAGES_PER_BATCH));
                let batch = pb::ServerBatch {
                    messages: std::mem::replace(&mut pending.messages, rest),
                };
                if let Err(slow) = pending.tx.send(batch) {
                    pending.tx.end(slow.status());
                    too_slow.push((pending.id, slow));
                    continue 'streams;
                }
            }
            if let Some(status) = pending.end {
                pending.tx.end(status);
            }
        }
        too_slow
    }
}
