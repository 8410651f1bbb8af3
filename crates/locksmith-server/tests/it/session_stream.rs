//! The session stream protocol, as a raw client sees it: every message of a
//! client batch is handled on its own and in order, a batch that breaks the
//! stream protocol or the size limit ends the stream before any of it runs,
//! the first batch may carry requests after its `open`, and `queued` replies
//! come only to acquires that ask for them.

use std::collections::VecDeque;
use std::future::Future;
use std::time::Duration;

use locksmith_proto::v1 as pb;
use locksmith_server::{Server, ServerConfig};
use pb::client_message::Kind as Out;
use pb::locksmith_client::LocksmithClient;
use pb::server_message::Kind as In;
use tokio::sync::mpsc;
use tonic::transport::Channel;
use tonic::Code;

/// Largest client message the test server accepts.
const MAX_MESSAGE: usize = 64 << 10;

/// A server whose storage is its own temporary directory, removed when it
/// has stopped (a directory of the test's own could go while the stopping
/// server still writes its last snapshot), configured by `configure`.
pub(crate) async fn server_with(configure: impl FnOnce(&mut ServerConfig)) -> Server {
    let mut config = ServerConfig::in_memory().listen("127.0.0.1:0".parse().unwrap());
    configure(&mut config);
    Server::start(config).await.expect("start the server")
}

/// A server as [`server_with`] makes it, with a small message size limit.
async fn server() -> Server {
    server_with(|config| config.max_message_bytes = MAX_MESSAGE).await
}

/// A gRPC client on a connection of its own to `server`.
pub(crate) async fn grpc(server: &Server) -> LocksmithClient<Channel> {
    LocksmithClient::connect(format!("http://{}", server.local_addr()))
        .await
        .expect("gRPC connect")
}

/// How many more tasks the server runs while what `work` keeps is alive:
/// the server (made by `start`) on a runtime of its own with one worker,
/// `work` on a connection of its own from another runtime, so that the
/// client's tasks do not count.
pub(crate) fn server_tasks_added_by<K>(
    start: impl Future<Output = Server>,
    work: impl AsyncFnOnce(LocksmithClient<Channel>) -> K,
) -> usize {
    let serving = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("server runtime");
    let server = serving.block_on(start);
    let tasks = || serving.metrics().num_alive_tasks();
    let client = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("client runtime");
    let added = client.block_on(async {
        let connection = grpc(&server).await;
        let before = tasks();
        let kept = work(connection).await;
        let added = tasks().saturating_sub(before);
        drop(kept);
        added
    });
    drop(client);
    serving.block_on(server.shutdown()).expect("shutdown");
    added
}

/// A session stream driven by hand, batch by batch.
struct Raw {
    tx: mpsc::UnboundedSender<pb::ClientBatch>,
    inbound: tonic::Streaming<pb::ServerBatch>,
    buffered: VecDeque<pb::ServerMessage>,
}

impl Raw {
    /// Starts a stream whose first batch is `first`, on a connection of its
    /// own.
    async fn start(server: &Server, first: Vec<Out>) -> Raw {
        Raw::start_on(grpc(server).await, first).await
    }

    /// Starts a stream whose first batch is `first` on `client`'s
    /// connection.
    async fn start_on(mut client: LocksmithClient<Channel>, first: Vec<Out>) -> Raw {
        let (tx, rx) = mpsc::unbounded_channel();
        let outbound = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|batch| (batch, rx))
        });
        let raw = Raw {
            inbound: client
                .session(outbound)
                .await
                .expect("session call")
                .into_inner(),
            tx,
            buffered: VecDeque::new(),
        };
        raw.send(first);
        raw
    }

    /// Opens a session.
    async fn opened(server: &Server) -> Raw {
        let mut raw = Raw::start(server, vec![open()]).await;
        assert!(matches!(raw.next().await, Ok(In::Opened(_))));
        raw
    }

    /// The status the stream ends with next.
    async fn ended(&mut self) -> tonic::Status {
        match self.next().await {
            Err(status) => status,
            Ok(other) => panic!("expected the stream to end, got {other:?}"),
        }
    }

    /// Opens a session whose first batch also acquires `name` (request 1), and
    /// checks both answers.
    async fn holding(server: &Server, name: &str, owner: &str) -> Raw {
        let mut raw = Raw::start(server, vec![open(), acquire(1, name, owner)]).await;
        assert!(matches!(raw.next().await, Ok(In::Opened(_))));
        let replies = raw.replies(1).await;
        assert!(
            matches!(replies[0], (1, pb::reply::Result::Granted(_))),
            "{replies:?}"
        );
        raw
    }

    fn send(&self, kinds: Vec<Out>) {
        let messages = kinds
            .into_iter()
            .map(|kind| pb::ClientMessage { kind: Some(kind) })
            .collect();
        self.tx
            .send(pb::ClientBatch {
                messages,
                ..Default::default()
            })
            .expect("stream open");
    }

    /// The next message, or the status the stream ended with.
    async fn next(&mut self) -> Result<In, tonic::Status> {
        loop {
            if let Some(message) = self.buffered.pop_front() {
                return Ok(message.kind.expect("a message has a kind"));
            }
            let batch = tokio::time::timeout(Duration::from_secs(10), self.inbound.message())
                .await
                .expect("a message within 10 s")?
                .expect("the stream ends with a status");
            assert!(!batch.messages.is_empty(), "empty server batch");
            self.buffered.extend(batch.messages);
        }
    }

    /// The final replies to `count` requests, by id, in the order they came.
    async fn replies(&mut self, count: usize) -> Vec<(u64, pb::reply::Result)> {
        let mut replies = Vec::new();
        while replies.len() < count {
            match self.next().await.expect("stream open") {
                In::Reply(pb::Reply {
                    id,
                    result: Some(result),
                }) if !matches!(result, pb::reply::Result::Queued(_)) => replies.push((id, result)),
                _ => {}
            }
        }
        replies
    }
}

fn open() -> Out {
    Out::Open(pb::OpenSession {
        client_name: "batches".into(),
        host: "test".into(),
        ttl_ms: 5_000,
    })
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

fn acquire_waiting(id: u64, name: &str, owner: &str, notify_queued: bool) -> Out {
    Out::Request(pb::Request {
        id,
        op: Some(pb::request::Op::Acquire(pb::Acquire {
            names: vec![name.into()],
            owner: owner.into(),
            wait: pb::WaitKind::Forever as i32,
            notify_queued,
            ..Default::default()
        })),
    })
}

fn release(id: u64, name: &str, owner: &str) -> Out {
    Out::Request(pb::Request {
        id,
        op: Some(pb::request::Op::Release(pb::Release {
            name: name.into(),
            owner: owner.into(),
            token: None,
        })),
    })
}

fn error_code(result: &pb::reply::Result) -> Option<pb::ErrorCode> {
    match result {
        pb::reply::Result::Error(error) => pb::ErrorCode::try_from(error.code).ok(),
        _ => None,
    }
}

async fn holders(server: &Server, name: &str) -> Vec<String> {
    let described = grpc(server)
        .await
        .describe(pb::DescribeRequest { name: name.into() })
        .await
        .expect("describe")
        .into_inner();
    described
        .lock
        .map(|lock| lock.holders.into_iter().map(|h| h.owner).collect())
        .unwrap_or_default()
}

/// An idle session's heartbeats are answered by the leader under its lease
/// (a member alone in its group always has it) and write nothing to the
/// log, however many: one answer each, in the order they came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_of_an_idle_session_write_nothing_to_the_log() {
    let server = server().await;
    let mut raw = Raw::holding(&server, "idle/held", "a").await;
    let before = server.stats();
    for _ in 0..20 {
        raw.send(vec![Out::Heartbeat(pb::Heartbeat {})]);
    }
    raw.send(vec![
        Out::Heartbeat(pb::Heartbeat {}),
        Out::Heartbeat(pb::Heartbeat {}),
    ]);
    for answered in 0..22 {
        match raw.next().await {
            Ok(In::Heartbeat(_)) => {}
            other => panic!("heartbeat {answered}: expected its answer, got {other:?}"),
        }
    }
    let after = server.stats();
    assert_eq!(
        (after.fsyncs, after.records),
        (before.fsyncs, before.records),
        "no log entry and no record for 22 heartbeats"
    );
    // The session lives on, and its hold with it.
    assert_eq!(holders(&server, "idle/held").await, ["a"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_message_of_a_batch_gets_its_own_answer() {
    let server = server().await;
    let mut raw = Raw::holding(&server, "batch/first", "a").await;

    // Valid and invalid requests mixed in one batch.
    raw.send(vec![
        acquire(2, "batch/a", "a"),
        acquire(3, "batch//bad", "a"),
        Out::Request(pb::Request { id: 4, op: None }),
        acquire(5, "batch/b", "b"),
        release(6, "batch/a", "someone-else"),
        acquire(7, "batch/c", ""),
        release(8, "batch/first", "a"),
        Out::Heartbeat(pb::Heartbeat {}),
        acquire(9, "batch/b", "c"),
    ]);
    let replies = raw.replies(8).await;
    let ids: Vec<u64> = replies.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, [2, 3, 4, 5, 6, 7, 8, 9], "answered in order");
    assert!(matches!(replies[0].1, pb::reply::Result::Granted(_)));
    assert_eq!(error_code(&replies[1].1), Some(pb::ErrorCode::InvalidName));
    assert_eq!(
        error_code(&replies[2].1),
        Some(pb::ErrorCode::InvalidArgument)
    );
    assert!(matches!(replies[3].1, pb::reply::Result::Granted(_)));
    assert_eq!(error_code(&replies[4].1), Some(pb::ErrorCode::NotOwner));
    assert_eq!(
        error_code(&replies[5].1),
        Some(pb::ErrorCode::InvalidArgument)
    );
    assert!(matches!(replies[6].1, pb::reply::Result::Done(_)));
    assert!(matches!(replies[7].1, pb::reply::Result::WouldBlock(_)));

    // Nothing else changed: the refused requests left no trace.
    assert_eq!(holders(&server, "batch/a").await, ["a"]);
    assert_eq!(holders(&server, "batch/b").await, ["b"]);
    assert!(holders(&server, "batch/c").await.is_empty());
    assert!(holders(&server, "batch/first").await.is_empty());
    drop(raw);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_breaks_the_protocol_ends_the_stream_before_it_runs() {
    let server = server().await;
    let mut raw = Raw::opened(&server).await;
    raw.send(vec![acquire(1, "broken/a", "a"), open()]);
    let status = raw.ended().await;
    assert_eq!(status.code(), Code::FailedPrecondition, "{status}");
    assert!(holders(&server, "broken/a").await.is_empty());
    drop(raw);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_batch_gets_the_size_limit_error_and_nothing_runs() {
    let server = server().await;
    let mut raw = Raw::opened(&server).await;
    // Each acquire is small; together they pass the limit.
    let name = |i: u64| format!("oversized/{i:0>200}");
    let batch: Vec<Out> = (1..=MAX_MESSAGE as u64 / 200)
        .map(|i| acquire(i, &name(i), "a"))
        .collect();
    raw.send(batch);
    let status = raw.ended().await;
    assert!(
        matches!(status.code(), Code::OutOfRange | Code::ResourceExhausted),
        "{status}"
    );
    assert!(holders(&server, &name(1)).await.is_empty());

    // The server keeps serving: a new stream works.
    Raw::holding(&server, "oversized/after", "a").await;
    drop(raw);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_is_sent_only_when_asked() {
    let server = server().await;
    let mut raw = Raw::holding(&server, "queued/a", "holder").await;
    raw.send(vec![
        acquire_waiting(2, "queued/a", "quiet", false),
        acquire_waiting(3, "queued/a", "told", true),
    ]);
    match raw.next().await {
        Ok(In::Reply(pb::Reply {
            id: 3,
            result: Some(pb::reply::Result::Queued(queued)),
        })) => assert_eq!(queued.position, 1, "one waiter ahead"),
        other => panic!("expected the queued reply to 3 only, got {other:?}"),
    }
    // The releases hand the lock on in FIFO order; each grant is pushed
    // (before the release's own reply).
    for (release_id, owner, granted_id) in [(4, "holder", 2), (5, "quiet", 3)] {
        raw.send(vec![release(release_id, "queued/a", owner)]);
        let replies = raw.replies(2).await;
        assert!(
            matches!(replies[0], (id, pb::reply::Result::Granted(_)) if id == granted_id),
            "{replies:?}"
        );
        assert!(
            matches!(replies[1], (id, pb::reply::Result::Done(_)) if id == release_id),
            "{replies:?}"
        );
    }
    drop(raw);
    server.shutdown().await.unwrap();
}

/// An idle session keeps two small tasks on the server: the transport's for
/// its HTTP/2 stream, and the reader of the client's side, a future written
/// by hand (the `async fn` before it was about 2 KiB a session). Counted on
/// a runtime of the server's own, so that the client's tasks do not count.
#[test]
fn an_idle_session_keeps_two_small_tasks() {
    const SESSIONS: usize = 64;
    let added = server_tasks_added_by(server(), async |connection| {
        let mut sessions = Vec::new();
        for _ in 0..SESSIONS {
            let mut raw = Raw::start_on(connection.clone(), vec![open()]).await;
            assert!(matches!(raw.next().await, Ok(In::Opened(_))));
            sessions.push(raw);
        }
        // Each answers a heartbeat: every stream is attached and read.
        for raw in &sessions {
            raw.send(vec![Out::Heartbeat(pb::Heartbeat {})]);
        }
        for raw in &mut sessions {
            assert!(matches!(raw.next().await, Ok(In::Heartbeat(_))));
        }
        sessions
    });
    assert!(
        added <= 2 * SESSIONS + 4,
        "{added} more server tasks with {SESSIONS} idle sessions on one connection"
    );
}
