//! Commit notices to a follower folded into the request after them.
//!
//! When an entry commits, openraft wakes every replication stream to tell
//! its follower the new commit index, in a request of its own with no
//! entries, and only then hands the entry to the state machine. At one
//! client that is a request and an answer to each follower for every
//! commit, besides the one that carried the entry: half of the cluster's
//! messages, and on the leader's worker they ran between the commit and
//! the client's answer (docs/BENCHMARKS.md, "Commit notices folded into the
//! next request").
//!
//! A follower needs the commit index only to apply, and every later request
//! carries it, heartbeats included. So a request with no entries waits here
//! for up to [`NOTICE_HOLD`]: a request that comes meanwhile replaces it
//! (it was made later, so its commit index is at least as high, and it
//! starts where the held one would have checked the follower's log); if
//! none comes, it goes as it is. openraft counts a request as answered by
//! any answer that reaches as far, so a folded request needs none of its
//! own. The leader's lease counts from when openraft made the request a
//! follower answered: for a notice held and then sent, up to
//! [`NOTICE_HOLD`] before it went out, which only shortens the lease.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use openraft::raft::AppendEntriesRequest;
use tokio::time::Sleep;

use super::TypeConfig;

/// How long a request with no entries waits for another to carry its
/// commit index. A follower applies at most this much later; a leader with
/// requests to send sends them at once.
pub(crate) const NOTICE_HOLD: Duration = Duration::from_millis(1);

type Request = AppendEntriesRequest<TypeConfig>;

/// The replication stream's requests, each entry-less one held for up to
/// [`NOTICE_HOLD`] and dropped if a later request comes meanwhile.
pub(crate) struct CommitNotices<S> {
    input: S,
    /// An entry-less request not sent yet, and when it must go.
    held: Option<(Request, Pin<Box<Sleep>>)>,
    /// The input has ended: what is held goes, then nothing.
    ended: bool,
}

impl<S: Stream<Item = Request> + Unpin> CommitNotices<S> {
    pub(crate) fn new(input: S) -> CommitNotices<S> {
        CommitNotices {
            input,
            held: None,
            ended: false,
        }
    }
}

impl<S: Stream<Item = Request> + Unpin> Stream for CommitNotices<S> {
    type Item = Request;

    /// Never waits for the input with a request of its own ready: a held
    /// request goes when its time is up whether the input has more or not.
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Request>> {
        let this = self.get_mut();
        while !this.ended {
            match Pin::new(&mut this.input).poll_next(cx) {
                Poll::Ready(Some(request)) if request.entries.is_empty() => {
                    // A later notice replaces a held one; the first keeps
                    // its deadline, so notices in a row cannot hold forever.
                    let deadline = match this.held.take() {
                        Some((_, deadline)) => deadline,
                        None => Box::pin(tokio::time::sleep(NOTICE_HOLD)),
                    };
                    this.held = Some((request, deadline));
                }
                Poll::Ready(Some(request)) => {
                    this.held = None;
                    return Poll::Ready(Some(request));
                }
                Poll::Ready(None) => this.ended = true,
                Poll::Pending => {
                    let Some((_, deadline)) = &mut this.held else {
                        return Poll::Pending;
                    };
                    if deadline.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    return Poll::Ready(this.held.take().map(|(request, _)| request));
                }
            }
        }
        Poll::Ready(this.held.take().map(|(request, _)| request))
    }
}

#[cfg(test)]
mod tests {
    use futures::channel::mpsc;
    use futures::StreamExt;
    use openraft::type_config::alias::{EntryOf, LeaderIdOf, LogIdOf, VoteOf};
    use openraft::vote::RaftLeaderIdExt;
    use openraft::EntryPayload;

    use super::*;

    fn log_id(index: u64) -> LogIdOf<TypeConfig> {
        LogIdOf::<TypeConfig>::new(LeaderIdOf::<TypeConfig>::new_committed(1, 1), index)
    }

    /// A request after `prev` with entries up to `last` (none if equal),
    /// telling the commit index `commit`.
    fn request(prev: u64, last: u64, commit: u64) -> Request {
        Request {
            vote: VoteOf::<TypeConfig>::new_committed(1, 1),
            prev_log_id: Some(log_id(prev)),
            leader_commit: Some(log_id(commit)),
            entries: (prev + 1..=last)
                .map(|index| EntryOf::<TypeConfig> {
                    log_id: log_id(index),
                    payload: EntryPayload::Blank,
                })
                .collect(),
        }
    }

    fn seen(request: &Request) -> (u64, usize, u64) {
        let index = |id: &Option<LogIdOf<TypeConfig>>| id.as_ref().map_or(0, |id| id.index);
        (
            index(&request.prev_log_id),
            request.entries.len(),
            index(&request.leader_commit),
        )
    }

    type Replication = (
        mpsc::UnboundedSender<Request>,
        CommitNotices<mpsc::UnboundedReceiver<Request>>,
    );

    fn replication() -> Replication {
        let (tx, rx) = mpsc::unbounded();
        (tx, CommitNotices::new(rx))
    }

    /// What the stream gives now, without waiting.
    fn ready(
        stream: &mut CommitNotices<mpsc::UnboundedReceiver<Request>>,
    ) -> Poll<Option<Request>> {
        let waker = futures::task::noop_waker();
        Pin::new(stream).poll_next(&mut Context::from_waker(&waker))
    }

    #[tokio::test(start_paused = true)]
    async fn requests_with_entries_go_at_once() {
        let (tx, mut stream) = replication();
        tx.unbounded_send(request(4, 6, 4)).unwrap();
        let Poll::Ready(Some(sent)) = ready(&mut stream) else {
            panic!("a request with entries was held");
        };
        assert_eq!(seen(&sent), (4, 2, 4));
    }

    #[tokio::test(start_paused = true)]
    async fn a_commit_notice_alone_goes_after_the_hold() {
        let (tx, mut stream) = replication();
        tx.unbounded_send(request(6, 6, 6)).unwrap();
        assert!(ready(&mut stream).is_pending(), "the notice went at once");
        tokio::time::advance(NOTICE_HOLD - Duration::from_micros(1)).await;
        assert!(
            ready(&mut stream).is_pending(),
            "the notice went before its time"
        );
        let sent = tokio::time::timeout(Duration::from_micros(2), stream.next())
            .await
            .expect("the notice is held past its time")
            .expect("the stream ended");
        assert_eq!(seen(&sent), (6, 0, 6));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_within_the_hold_carries_the_notice() {
        let (tx, mut stream) = replication();
        tx.unbounded_send(request(6, 6, 6)).unwrap();
        assert!(ready(&mut stream).is_pending());
        tokio::time::advance(NOTICE_HOLD / 2).await;
        tx.unbounded_send(request(6, 7, 6)).unwrap();
        let Poll::Ready(Some(sent)) = ready(&mut stream) else {
            panic!("the request with entries was held");
        };
        assert_eq!(seen(&sent), (6, 1, 6), "the request after the notice");
        tokio::time::advance(NOTICE_HOLD).await;
        assert!(ready(&mut stream).is_pending(), "the notice went as well");
    }

    #[tokio::test(start_paused = true)]
    async fn notices_in_a_row_send_the_last_by_the_first_ones_time() {
        let (tx, mut stream) = replication();
        tx.unbounded_send(request(6, 6, 5)).unwrap();
        assert!(ready(&mut stream).is_pending());
        tokio::time::advance(NOTICE_HOLD / 2).await;
        tx.unbounded_send(request(6, 6, 6)).unwrap();
        assert!(ready(&mut stream).is_pending());
        tokio::time::advance(NOTICE_HOLD / 2).await;
        let Poll::Ready(Some(sent)) = ready(&mut stream) else {
            panic!("a later notice put off the first one's time");
        };
        assert_eq!(seen(&sent), (6, 0, 6), "the highest commit index goes");
        assert!(ready(&mut stream).is_pending(), "a notice went twice");
    }

    #[tokio::test(start_paused = true)]
    async fn the_end_of_the_requests_sends_what_is_held() {
        let (tx, mut stream) = replication();
        tx.unbounded_send(request(3, 3, 3)).unwrap();
        drop(tx);
        let Poll::Ready(Some(sent)) = ready(&mut stream) else {
            panic!("the held notice was not sent at the end");
        };
        assert_eq!(seen(&sent), (3, 0, 3));
        assert!(matches!(ready(&mut stream), Poll::Ready(None)));
    }
}
