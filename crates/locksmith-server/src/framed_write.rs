//! Writes on a framed stream's connection (the session stream's, module
//! `framed_session`, and a follower's replication stream's, module
//! `raft::append_stream`): everything queued by the time a write starts
//! goes in that one write, so that a burst costs one system call and one
//! wake-up of the reader on the other side, not one per message.

use bytes::BytesMut;
use futures::{FutureExt, Stream, StreamExt};

/// Bytes gathered into one write, at most (more once one message alone is
/// larger).
pub(crate) const WRITE_BYTES: usize = 64 << 10;

/// Appends to `buf` the frames of the next item of `items` (waiting for it
/// only when `buf` is empty) and of every item ready after it, up to
/// [`WRITE_BYTES`]. `put` appends one item's frames, or what ends the
/// stream when given `None` (`items` ended), and says whether the stream
/// is over. Returns whether it is.
///
/// Cancel safety: safe while waiting for the first item; an item taken is
/// in `buf`.
pub(crate) async fn gather<T>(
    items: &mut (impl Stream<Item = T> + Unpin),
    buf: &mut BytesMut,
    mut put: impl FnMut(&mut BytesMut, Option<T>) -> bool,
) -> bool {
    if buf.is_empty() && put(buf, items.next().await) {
        return true;
    }
    while buf.len() < WRITE_BYTES {
        match items.next().now_or_never() {
            Some(item) => {
                if put(buf, item) {
                    return true;
                }
            }
            None => break,
        }
    }
    false
}

/// Empties `buf` after a write, and lets go of a buffer a rare burst grew:
/// an idle connection keeps little.
pub(crate) fn reuse(buf: &mut BytesMut) {
    buf.clear();
    if buf.capacity() > WRITE_BYTES {
        *buf = BytesMut::new();
    }
}
