//! Many sessions on one `Sessions` stream, as a raw client sees it: each
//! channel is a session stream of its own (its own session, answers and
//! errors), a channel that breaks the protocol ends alone, channel numbers
//! are used once, a channel given up leaves its session to resume, the
//! sessions per connection count channels, and a stream without a session
//! ends.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use locksmith_proto::v1 as pb;
use locksmith_server::Server;
use pb::client_message::Kind as Out;
use pb::locksmith_client::LocksmithClient;
use pb::server_message::Kind as In;
use tokio::sync::mpsc;
use tonic::transport::Channel;
use tonic::Code;

use crate::session_stream::{grpc, server_tasks_added_by, server_with};

async fn server() -> Server {
    server_with(|_| {}).await
}

/// What a channel gets next: a message, or its end.
type Next = Result<In, pb::ChannelEnd>;

/// A `Sessions` stream driven by hand.
struct Channels {
    tx: Option<mpsc::UnboundedSender<pb::ClientChannelBatches>>,
    inbound: tonic::Streaming<pb::ServerChannelBatches>,
    buffered: HashMap<u64, VecDeque<Next>>,
}

impl Channels {
    /// Starts a stream on `client`'s connection.
    async fn start_on(mut client: LocksmithClient<Channel>) -> Channels {
        let (tx, rx) = mpsc::unbounded_channel();
        let outbound = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|batch| (batch, rx))
        });
        Channels {
            inbound: client
                .sessions(outbound)
                .await
                .expect("sessions call")
                .into_inner(),
            tx: Some(tx),
            buffered: HashMap::new(),
        }
    }

    async fn start(server: &Server) -> Channels {
        Channels::start_on(grpc(server).await).await
    }

    /// Sends one message: a batch for each channel named.
    fn send(&self, batches: Vec<(u64, Vec<Out>)>) {
        let batches = batches
            .into_iter()
            .map(|(channel, kinds)| pb::ClientChannelBatch {
                channel,
                batch: Some(batch(kinds)),
                done: false,
            })
            .collect();
        self.send_raw(pb::ClientChannelBatches { batches });
    }

    fn send_raw(&self, message: pb::ClientChannelBatches) {
        self.tx
            .as_ref()
            .expect("not ended")
            .send(message)
            .expect("stream open");
    }

    /// Opens a session on `channel` and returns what `opened` said.
    async fn open(&mut self, channel: u64) -> pb::SessionOpened {
        self.send(vec![(channel, vec![open()])]);
        match self.next(channel).await {
            Ok(In::Opened(opened)) => opened,
            other => panic!("channel {channel}: expected it to open, got {other:?}"),
        }
    }

    /// The next message or end of `channel`.
    async fn next(&mut self, channel: u64) -> Next {
        loop {
            if let Some(next) = self.buffered.entry(channel).or_default().pop_front() {
                return next;
            }
            let message = self
                .message()
                .await
                .unwrap_or_else(|status| panic!("the stream ended: {status}"));
            for tagged in message.batches {
                let queue = self.buffered.entry(tagged.channel).or_default();
                if let Some(batch) = tagged.batch {
                    queue.extend(
                        batch
                            .messages
                            .into_iter()
                            .map(|m| Ok(m.kind.expect("kind"))),
                    );
                }
                if let Some(end) = tagged.end {
                    queue.push_back(Err(end));
                }
            }
        }
    }

    /// The end of `channel`, with what came before it skipped.
    async fn ended(&mut self, channel: u64) -> pb::ChannelEnd {
        loop {
            if let Err(end) = self.next(channel).await {
                return end;
            }
        }
    }

    /// The final replies to `count` requests on `channel`, in the order they came.
    async fn replies(&mut self, channel: u64, count: usize) -> Vec<(u64, pb::reply::Result)> {
        let mut replies = Vec::new();
        while replies.len() < count {
            match self.next(channel).await {
                Ok(In::Reply(pb::Reply {
                    id,
                    result: Some(result),
                })) if !matches!(result, pb::reply::Result::Queued(_)) => {
                    replies.push((id, result))
                }
                Ok(_) => {}
                Err(end) => panic!("channel {channel} ended: {end:?}"),
            }
        }
        replies
    }

    /// The stream's next message: `Err` with the status it ended with
    /// (`Code::Ok` when it ended without one).
    async fn message(&mut self) -> Result<pb::ServerChannelBatches, tonic::Status> {
        tokio::time::timeout(Duration::from_secs(10), self.inbound.message())
            .await
            .expect("a message within 10 s")?
            .ok_or_else(|| tonic::Status::ok("the stream ended"))
    }

    /// The status the stream as a whole ends with, what came before skipped.
    async fn stream_end(&mut self) -> tonic::Status {
        loop {
            if let Err(status) = self.message().await {
                return status;
            }
        }
    }
}

fn batch(kinds: Vec<Out>) -> pb::ClientBatch {
    pb::ClientBatch {
        messages: kinds
            .into_iter()
            .map(|kind| pb::ClientMessage { kind: Some(kind) })
            .collect(),
        ..Default::default()
    }
}

fn open() -> Out {
    Out::Open(pb::OpenSession {
        client_name: "channels".into(),
        host: "test".into(),
        ttl_ms: 5_000,
    })
}

fn heartbeat() -> Out {
    Out::Heartbeat(pb::Heartbeat {})
}

fn acquire(id: u64, name: &str, owner: &str) -> Out {
    Out::Request(pb::Request {
        id,
        op: Some(pb::request::Op::Acquire(pb::Acquire {
            names: vec![name.into()],
            owner: owner.into(),
            wait: pb::WaitKind::No as i32,
            ..Default::default()
        })),
    })
}

fn granted(result: &pb::reply::Result) -> bool {
    matches!(result, pb::reply::Result::Granted(_))
}

async fn holders(server: &Server, name: &str) -> Vec<u64> {
    let described = grpc(server)
        .await
        .describe(pb::DescribeRequest { name: name.into() })
        .await
        .expect("describe")
        .into_inner();
    described
        .lock
        .map(|lock| lock.holders.into_iter().map(|h| h.session_id).collect())
        .unwrap_or_default()
}

async fn sessions(server: &Server) -> Vec<pb::SessionInfo> {
    grpc(server)
        .await
        .list_sessions(pb::ListSessionsRequest {})
        .await
        .expect("list sessions")
        .into_inner()
        .sessions
}

/// Two channels opened in one message are two sessions: the same owner
/// name does not share a lock between them, and the heartbeats of both,
/// sent together, are each answered and write nothing to the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_channel_is_a_session_of_its_own() {
    let server = server().await;
    let mut channels = Channels::start(&server).await;
    channels.send(vec![
        (1, vec![open(), acquire(1, "channels/a", "o")]),
        (
            2,
            vec![
                open(),
                acquire(1, "channels/a", "o"),
                acquire(2, "channels/b", "o"),
            ],
        ),
    ]);
    let mut ids = Vec::new();
    for channel in [1, 2] {
        match channels.next(channel).await {
            Ok(In::Opened(opened)) => ids.push(opened.session_id),
            other => panic!("channel {channel}: expected it to open, got {other:?}"),
        }
    }
    assert_ne!(ids[0], ids[1], "a session each");
    let first = channels.replies(1, 1).await;
    assert!(granted(&first[0].1), "{first:?}");
    let second = channels.replies(2, 2).await;
    assert!(
        matches!(second[0], (1, pb::reply::Result::WouldBlock(_))),
        "the other session holds it: {second:?}"
    );
    assert!(
        matches!(second[1], (2, ref result) if granted(result)),
        "{second:?}"
    );
    assert_eq!(holders(&server, "channels/a").await, [ids[0]]);
    assert_eq!(holders(&server, "channels/b").await, [ids[1]]);

    let before = server.stats();
    channels.send(vec![
        (1, vec![heartbeat()]),
        (2, vec![heartbeat(), heartbeat()]),
    ]);
    for (channel, answers) in [(1, 1), (2, 2)] {
        for _ in 0..answers {
            match channels.next(channel).await {
                Ok(In::Heartbeat(_)) => {}
                other => panic!("channel {channel}: expected a heartbeat answer, got {other:?}"),
            }
        }
    }
    let after = server.stats();
    assert_eq!(
        (after.records, after.fsyncs),
        (before.records, before.fsyncs),
        "heartbeats write nothing"
    );
    let listed = sessions(&server).await;
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().all(|s| s.connected), "{listed:?}");
    drop(channels);
    server.shutdown().await.unwrap();
}

/// A batch that breaks the stream protocol ends its channel, before any of
/// it runs; the other channels go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_that_breaks_the_protocol_ends_alone() {
    let server = server().await;
    let mut channels = Channels::start(&server).await;
    channels.open(1).await;
    channels.open(2).await;
    channels.send(vec![(1, vec![acquire(1, "broken/x", "o"), open()])]);
    let end = channels.ended(1).await;
    assert_eq!(end.code, Code::FailedPrecondition as i32, "{end:?}");
    assert!(holders(&server, "broken/x").await.is_empty(), "nothing ran");

    channels.send(vec![(2, vec![heartbeat(), acquire(1, "broken/x", "o")])]);
    assert!(matches!(channels.next(2).await, Ok(In::Heartbeat(_))));
    let replies = channels.replies(2, 1).await;
    assert!(granted(&replies[0].1), "{replies:?}");
    drop(channels);
    server.shutdown().await.unwrap();
}

/// A channel's number is used once: nothing runs on a channel that has
/// ended, nor on a new one numbered below one used before, and each is
/// told so; a higher number opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_number_is_used_once() {
    let server = server().await;
    let mut channels = Channels::start(&server).await;
    channels.open(5).await;

    channels.send(vec![(3, vec![open()])]);
    let below = channels.ended(3).await;
    assert_eq!(below.code, Code::FailedPrecondition as i32, "{below:?}");

    // A closed session ends its channel with `ended`, as it ends a stream.
    channels.send(vec![(5, vec![Out::Close(pb::Close {})])]);
    match channels.next(5).await {
        Ok(In::Ended(ended)) => assert_eq!(ended.reason, "closed"),
        other => panic!("expected the session's end, got {other:?}"),
    }
    channels.send(vec![(5, vec![open(), acquire(1, "once/a", "o")])]);
    let reused = channels.ended(5).await;
    assert_eq!(reused.code, Code::FailedPrecondition as i32, "{reused:?}");
    assert!(holders(&server, "once/a").await.is_empty(), "nothing ran");

    channels.open(6).await;
    assert_eq!(sessions(&server).await.len(), 1, "the session of channel 6");
    drop(channels);
    server.shutdown().await.unwrap();
}

/// A channel the client is done with detaches its session, which lives on
/// with its holds and resumes on another channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_given_up_leaves_its_session_to_resume() {
    let server = server().await;
    let mut channels = Channels::start(&server).await;
    channels.send(vec![(1, vec![open(), acquire(1, "resume/a", "o")])]);
    let Ok(In::Opened(opened)) = channels.next(1).await else {
        panic!("expected channel 1 to open");
    };
    assert!(granted(&channels.replies(1, 1).await[0].1));
    channels.send_raw(pb::ClientChannelBatches {
        batches: vec![pb::ClientChannelBatch {
            channel: 1,
            batch: None,
            done: true,
        }],
    });
    // Detached: listed, not connected, still holding.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while sessions(&server).await[0].connected {
        assert!(tokio::time::Instant::now() < deadline, "still attached");
        tokio::task::yield_now().await;
    }
    assert_eq!(holders(&server, "resume/a").await, [opened.session_id]);

    channels.send(vec![(
        2,
        vec![Out::Resume(pb::ResumeSession {
            session_id: opened.session_id,
            secret: opened.secret.clone(),
        })],
    )]);
    match channels.next(2).await {
        Ok(In::Resumed(resumed)) => assert_eq!(resumed.session_id, opened.session_id),
        other => panic!("expected the session to resume, got {other:?}"),
    }
    assert!(sessions(&server).await[0].connected);
    drop(channels);
    server.shutdown().await.unwrap();
}

/// The client ending its side detaches every channel's session; the stream
/// ends with OK.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_ended_by_its_client_detaches_every_session() {
    let server = server().await;
    let mut channels = Channels::start(&server).await;
    channels.open(1).await;
    channels.open(2).await;
    channels.tx = None;
    assert_eq!(channels.stream_end().await.code(), Code::Ok);
    let listed = sessions(&server).await;
    assert_eq!(listed.len(), 2, "both live on by their TTL");
    assert!(listed.iter().all(|s| !s.connected), "{listed:?}");
    drop(channels);
    server.shutdown().await.unwrap();
}

/// The sessions allowed per connection count channels: past the limit a new
/// channel is refused; once a session ends, its place is free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channels_count_against_the_sessions_per_connection() {
    let server = server_with(|config| config.max_sessions_per_connection = 2).await;
    let mut channels = Channels::start(&server).await;
    channels.open(1).await;
    channels.open(2).await;
    channels.send(vec![(3, vec![open()])]);
    let refused = channels.ended(3).await;
    assert_eq!(refused.code, Code::ResourceExhausted as i32, "{refused:?}");

    channels.send(vec![(1, vec![Out::Close(pb::Close {})])]);
    assert!(matches!(channels.next(1).await, Ok(In::Ended(_))));
    channels.open(4).await;
    assert_eq!(sessions(&server).await.len(), 2);
    drop(channels);
    server.shutdown().await.unwrap();
}

/// A stream that carries no session is ended: one that never opens one
/// within the open timeout, and one whose sessions have all ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_without_a_session_ends() {
    // Long enough that a loaded machine delivers an `open` in time.
    let server = server_with(|config| config.open_timeout = Duration::from_secs(1)).await;
    let connection = grpc(&server).await;
    let mut never = Channels::start_on(connection.clone()).await;
    assert_eq!(never.stream_end().await.code(), Code::DeadlineExceeded);

    let mut emptied = Channels::start_on(connection).await;
    emptied.open(1).await;
    emptied.send(vec![(1, vec![Out::Close(pb::Close {})])]);
    assert!(matches!(emptied.next(1).await, Ok(In::Ended(_))));
    assert_eq!(emptied.stream_end().await.code(), Code::DeadlineExceeded);
    server.shutdown().await.unwrap();
}

/// Idle sessions on channels keep no task each on the server: the stream's
/// transport task and its reader serve them all. Counted on a runtime of
/// the server's own, so that the client's tasks do not count.
#[test]
fn idle_sessions_on_channels_keep_no_task_each() {
    const SESSIONS: u64 = 64;
    let added = server_tasks_added_by(server(), async |connection| {
        let mut channels = Channels::start_on(connection).await;
        channels.send((1..=SESSIONS).map(|c| (c, vec![open()])).collect());
        for channel in 1..=SESSIONS {
            assert!(matches!(channels.next(channel).await, Ok(In::Opened(_))));
        }
        channels.send((1..=SESSIONS).map(|c| (c, vec![heartbeat()])).collect());
        for channel in 1..=SESSIONS {
            assert!(matches!(channels.next(channel).await, Ok(In::Heartbeat(_))));
        }
        channels
    });
    assert!(
        added <= 4,
        "{added} more server tasks with {SESSIONS} idle sessions on one stream"
    );
}

/// A client that has channels refused without reading of their ends cannot
/// make the server queue ends without bound: past the unread limit the
/// stream as a whole ends, `RESOURCE_EXHAUSTED`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_left_unread_end_the_stream() {
    let server = server_with(|config| config.max_stream_backlog_bytes = 4096).await;
    let mut channels = Channels::start(&server).await;
    channels.open(2).await;
    // Channel 1 is below channel 2: each batch for it is refused with an
    // end of about 100 bytes; 100 000 of them are more than the transport
    // takes while the client reads nothing.
    let refused = pb::ClientChannelBatches {
        batches: vec![
            pb::ClientChannelBatch {
                channel: 1,
                batch: None,
                done: false,
            };
            1000
        ],
    };
    let tx = channels.tx.clone().expect("the stream is open");
    for _ in 0..100 {
        // The server may end the stream before the last of them is sent:
        // the rest then have nowhere to go.
        if tx.send(refused.clone()).is_err() {
            break;
        }
    }
    let status = channels.stream_end().await;
    assert_eq!(status.code(), Code::ResourceExhausted, "{status}");
    assert!(status.message().contains("too slow"), "{status}");
    // Channel 2's session is detached, not lost.
    let listed = sessions(&server).await;
    assert_eq!(listed.len(), 1);
    server.shutdown().await.unwrap();
}
