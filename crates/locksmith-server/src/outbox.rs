//! What one engine batch sends to the session streams, held until the batch's
//! log records are durable and then sent as **one [`pb::ServerBatch`] per
//! stream**.
//!
//! Grouping by stream is what makes a multiplexed client cheap: 64 requests
//! answered in one engine batch reach their stream as one channel send, one
//! wake-up of the stream's task and one HTTP/2 message, not 64 of each.

use std::collections::HashMap;

use locksmith_proto::v1 as pb;
use tonic::Status;

use crate::core::{StreamId, StreamTx};

/// The messages of one engine batch, per stream, in the order they were made.
#[derive(Default)]
pub(crate) struct Outbox {
    /// Streams in the order they first got a message.
    pending: Vec<Pending>,
    /// Where each stream's entry is in `pending`.
    index: HashMap<StreamId, usize>,
}

struct Pending {
    tx: StreamTx,
    messages: Vec<pb::ServerMessage>,
    /// Ends the stream with this status after the messages.
    end: Option<Status>,
}

impl Outbox {
    fn entry(&mut self, stream: StreamId, tx: &StreamTx) -> &mut Pending {
        let at = *self.index.entry(stream).or_insert_with(|| {
            self.pending.push(Pending {
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

    /// Ends `stream` with `status` once its queued messages are sent.
    pub(crate) fn end(&mut self, stream: StreamId, tx: &StreamTx, status: Status) {
        self.entry(stream, tx).end = Some(status);
    }

    /// Whether nothing is queued.
    pub(crate) fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Forgets everything queued (replay, or a storage failure: nothing of the
    /// batch may be seen).
    pub(crate) fn clear(&mut self) {
        self.pending.clear();
        self.index.clear();
    }

    /// Sends every stream its batch (and its end, if any).
    pub(crate) fn flush(&mut self) {
        self.index.clear();
        for pending in self.pending.drain(..) {
            if !pending.messages.is_empty() {
                let batch = pb::ServerBatch {
                    messages: pending.messages,
                };
                let _ = pending.tx.send(Ok(batch));
            }
            if let Some(status) = pending.end {
                let _ = pending.tx.send(Err(status));
            }
        }
    }
}
