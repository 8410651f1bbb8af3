//! The framed session stream (`locksmith_proto::framed`) as a raw client
//! sees it: on the server's one port beside gRPC, it opens, runs and ends as
//! the `Session` call does; a refused hello, an oversized frame and a silent
//! connection get the call's answers; and a connection whose stream is over
//! is closed and leaves no task behind, whether or not the client closes
//! its side.

use std::time::Duration;

use bytes::{BufMut, BytesMut};
use futures::StreamExt;
use locksmith_proto::framed;
use locksmith_proto::v1 as pb;
use locksmith_server::Server;
use pb::client_message::Kind as Out;
use pb::framed_server_frame::Kind as Frame;
use pb::server_message::Kind as In;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::codec::{Framed, LengthDelimitedCodec};
use tonic::metadata::MetadataMap;
use tonic::Code;

use crate::session_stream::server_with;

/// Largest client message the test server accepts.
const MAX_MESSAGE: usize = 64 << 10;

/// How long any one answer may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(10);

/// A framed connection driven by hand.
struct Raw {
    frames: Framed<TcpStream, LengthDelimitedCodec>,
}

impl Raw {
    /// Connects and sends the magic and a hello with `metadata`.
    async fn connect_with(server: &Server, metadata: &MetadataMap) -> Raw {
        let mut tcp = TcpStream::connect(server.local_addr()).await.unwrap();
        let mut opening = BytesMut::from(&framed::MAGIC[..]);
        framed::put_frame(&mut opening, &framed::hello(metadata));
        tcp.write_all(&opening).await.unwrap();
        Raw {
            frames: Framed::new(tcp, framed::codec(1 << 20)),
        }
    }

    /// Connects, is accepted, and sends `first` as the first batch.
    async fn start(server: &Server, first: Vec<Out>) -> Raw {
        let mut raw = Raw::connect_with(server, &MetadataMap::new()).await;
        assert!(
            matches!(raw.frame().await, Frame::Accepted(_)),
            "accepted first"
        );
        raw.send(first).await;
        raw
    }

    async fn send(&mut self, kinds: Vec<Out>) {
        let batch = pb::ClientBatch {
            messages: kinds
                .into_iter()
                .map(|kind| pb::ClientMessage { kind: Some(kind) })
                .collect(),
            ..Default::default()
        };
        let mut buf = BytesMut::new();
        framed::put_frame(&mut buf, &batch);
        self.frames.get_mut().write_all(&buf).await.unwrap();
    }

    /// The next frame.
    async fn frame(&mut self) -> Frame {
        let frame = tokio::time::timeout(PATIENCE, self.frames.next())
            .await
            .expect("a frame in time")
            .expect("a frame, not the connection's end")
            .expect("a frame that reads");
        framed::decode::<pb::FramedServerFrame>(&frame)
            .expect("a frame that decodes")
            .kind
            .expect("a frame with a kind")
    }

    /// The next batch's messages.
    async fn batch(&mut self) -> Vec<In> {
        match self.frame().await {
            Frame::Batch(batch) => batch
                .messages
                .into_iter()
                .map(|m| m.kind.expect("a message has a kind"))
                .collect(),
            other => panic!("expected a batch, got {other:?}"),
        }
    }

    /// The status the stream ends with, skipping batches before it; then
    /// checks that the server closes the connection.
    async fn ended(&mut self) -> tonic::Status {
        loop {
            match self.frame().await {
                Frame::Batch(_) => continue,
                Frame::Status(status) => {
                    self.closed().await;
                    return framed::status_of(status);
                }
                Frame::Accepted(_) => panic!("accepted twice"),
            }
        }
    }

    /// Waits for the server's end of the connection.
    async fn closed(&mut self) {
        let mut rest = Vec::new();
        let read = tokio::time::timeout(PATIENCE, self.frames.get_mut().read_to_end(&mut rest))
            .await
            .expect("the server closes the connection in time");
        assert!(matches!(read, Ok(0)), "nothing after the end: {read:?}");
    }
}

fn open() -> Out {
    Out::Open(pb::OpenSession {
        client_name: "framed".into(),
        host: "test".into(),
        ttl_ms: 5_000,
    })
}

fn acquire(id: u64, name: &str) -> Out {
    Out::Request(pb::Request {
        id,
        op: Some(pb::request::Op::Acquire(pb::Acquire {
            names: vec![name.into()],
            owner: "a".into(),
            wait: pb::WaitKind::No as i32,
            ..Default::default()
        })),
    })
}

async fn server() -> Server {
    server_with(|config| {
        config.max_message_bytes = MAX_MESSAGE;
        config.handshake_timeout = Duration::from_millis(300);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_framed_stream_opens_runs_and_ends_as_the_call_does() {
    let server = server().await;
    let mut raw = Raw::start(&server, vec![open(), acquire(1, "framed/a")]).await;
    let mut messages = raw.batch().await;
    while messages.len() < 2 {
        messages.extend(raw.batch().await);
    }
    assert!(matches!(messages[0], In::Opened(_)), "{messages:?}");
    assert!(
        matches!(
            &messages[1],
            In::Reply(pb::Reply {
                id: 1,
                result: Some(pb::reply::Result::Granted(_))
            })
        ),
        "{messages:?}"
    );

    // The gRPC calls on the same port see the framed session's hold.
    let mut grpc = crate::session_stream::grpc(&server).await;
    let described = grpc
        .describe(pb::DescribeRequest {
            name: "framed/a".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(described.lock.unwrap().holders.len(), 1);

    raw.send(vec![Out::Close(pb::Close {})]).await;
    let mut ended = false;
    while !ended {
        ended = raw.batch().await.iter().any(|m| matches!(m, In::Ended(_)));
    }
    // The session is over, so is its stream: OK, and the connection closes.
    assert_eq!(raw.ended().await.code(), Code::Ok);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hello_that_does_not_decode_is_refused_with_invalid_argument() {
    let server = server().await;
    let mut tcp = TcpStream::connect(server.local_addr()).await.unwrap();
    let mut bytes = BytesMut::from(&framed::MAGIC[..]);
    bytes.put_u32(3);
    bytes.put_slice(&[0xff, 0xff, 0xff]);
    tcp.write_all(&bytes).await.unwrap();
    let mut raw = Raw {
        frames: Framed::new(tcp, framed::codec(1 << 20)),
    };
    assert_eq!(raw.ended().await.code(), Code::InvalidArgument);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_sends_no_hello_is_closed() {
    let server = server().await;
    let mut tcp = TcpStream::connect(server.local_addr()).await.unwrap();
    tcp.write_all(framed::MAGIC).await.unwrap();
    let mut raw = Raw {
        frames: Framed::new(tcp, framed::codec(1 << 20)),
    };
    // Closed after the handshake timeout, with nothing sent.
    raw.closed().await;
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_frame_ends_the_stream_with_the_size_limit_error() {
    let server = server().await;
    let mut raw = Raw::start(&server, vec![open()]).await;
    assert!(matches!(raw.batch().await[0], In::Opened(_)));
    // Only the length: the server refuses it before the bytes come.
    let mut header = BytesMut::new();
    header.put_u32(MAX_MESSAGE as u32 + 1);
    raw.frames.get_mut().write_all(&header).await.unwrap();
    assert_eq!(raw.ended().await.code(), Code::OutOfRange);

    // The server keeps serving.
    let mut again = Raw::start(&server, vec![open()]).await;
    assert!(matches!(again.batch().await[0], In::Opened(_)));
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_opens_nothing_in_time_ends_with_deadline_exceeded() {
    let server = server_with(|config| config.open_timeout = Duration::from_millis(200)).await;
    let mut raw = Raw::connect_with(&server, &MetadataMap::new()).await;
    assert!(matches!(raw.frame().await, Frame::Accepted(_)));
    assert_eq!(raw.ended().await.code(), Code::DeadlineExceeded);
    server.shutdown().await.unwrap();
}

/// The server's end of a framed connection once its stream is over: the
/// connection is closed, and the stream's tasks end, while the client keeps
/// its side open and sends nothing more.
#[test]
fn a_stream_that_is_over_leaves_no_task_behind() {
    let serving = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let server = serving.block_on(server());
    let tasks = || serving.metrics().num_alive_tasks();
    let client = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    client.block_on(async {
        // The administrator's connection is up, and stays, before the count.
        let mut admin = crate::session_stream::grpc(&server).await;
        assert!(open_sessions(&mut admin).await.is_empty());
        let before = tasks();
        let mut raw = Raw::start(&server, vec![open()]).await;
        assert!(matches!(raw.batch().await[0], In::Opened(_)));
        let [session_id] = open_sessions(&mut admin).await[..] else {
            panic!("one session open");
        };
        admin
            .end_session(pb::EndSessionRequest { session_id })
            .await
            .unwrap();
        raw.ended().await;
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while tasks() > before {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the stream's tasks ended: {} alive, {before} before",
                tasks()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(raw);
    });
    drop(client);
    serving.block_on(server.shutdown()).unwrap();
}

/// The ids of the server's sessions that have a stream.
async fn open_sessions(
    admin: &mut pb::locksmith_client::LocksmithClient<tonic::transport::Channel>,
) -> Vec<u64> {
    let sessions = admin
        .list_sessions(pb::ListSessionsRequest {})
        .await
        .unwrap()
        .into_inner()
        .sessions;
    sessions
        .iter()
        .filter(|s| s.connected)
        .map(|s| s.session_id)
        .collect()
}
