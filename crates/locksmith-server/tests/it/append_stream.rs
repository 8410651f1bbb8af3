//! The members' framed replication stream (`raft.proto`, the server's
//! module `raft::append_stream`) in a cluster of three in one process: the
//! leader replicates on it, and each connection carries one session after
//! another (openraft opens a session for every heartbeat), so a handful of
//! connections serve every session of a busy second; and what a leader
//! sends on it is checked before openraft sees it.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{BufMut, BytesMut};
use futures::StreamExt;
use locksmith::Client;
use locksmith_proto::framed::{self, APPEND_MAGIC, MAGIC};
use locksmith_proto::raft::{append_frame::Kind, AppendEnd, AppendFrame};
use locksmith_proto::transport::Connector;
use locksmith_server::{Accepting, Environment, Listener, Server, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::codec::LengthDelimitedCodec;
use tonic::Code;

/// The first bytes each connection a member opened wrote.
type Openings = Arc<Mutex<Vec<Arc<Mutex<Vec<u8>>>>>>;

/// A member's connection to another, keeping its first bytes.
struct Recorded {
    stream: TcpStream,
    first: Arc<Mutex<Vec<u8>>>,
}

impl AsyncRead for Recorded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Recorded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = std::task::ready!(Pin::new(&mut self.stream).poll_write(cx, buf))?;
        let mut first = self.first.lock().unwrap();
        let wanted = MAGIC.len().saturating_sub(first.len()).min(written);
        first.extend_from_slice(&buf[..wanted]);
        Poll::Ready(Ok(written))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

struct Given(TcpListener);

impl Listener for Given {
    fn accept(&mut self) -> Accepting<'_> {
        Box::pin(async move {
            let (stream, peer) = self.0.accept().await?;
            stream.set_nodelay(true)?;
            Ok((Box::new(stream) as _, peer))
        })
    }
}

fn recording(openings: Openings) -> Connector {
    Connector::new(move |to: String| {
        let openings = openings.clone();
        async move {
            let stream = TcpStream::connect(to).await?;
            stream.set_nodelay(true)?;
            let first = Arc::default();
            openings.lock().unwrap().push(Arc::clone(&first));
            Ok(Recorded { stream, first })
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_replicate_on_a_few_framed_connections_each_carrying_many_sessions() {
    let mut listeners = Vec::new();
    for _ in 0..3 {
        listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let addrs: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    let cluster: Vec<(u64, String)> = (1..).zip(addrs.iter().map(|a| a.to_string())).collect();
    let openings = Openings::default();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let heartbeat = Duration::from_millis(25);
    let mut starting = Vec::new();
    for ((listener, addr), (id, dir)) in listeners.into_iter().zip(&addrs).zip((1..).zip(&dirs)) {
        let mut config = ServerConfig::durable(dir.path()).listen(*addr);
        config.node_id = id;
        config.cluster = cluster.clone();
        config.raft_heartbeat = heartbeat;
        let environment = Environment::machine()
            .listener(Given(listener))
            .connector(recording(openings.clone()));
        starting.push(tokio::spawn(Server::start_in(config, environment)));
    }
    let mut members = Vec::new();
    for started in starting {
        members.push(started.await.unwrap().expect("a member starts"));
    }
    let url = format!(
        "locksmith://{}",
        addrs
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    let client = Client::connect(&url).await.unwrap();

    // A second of work: forty heartbeats to each follower at the least,
    // each a session of its own, and the commits' replication beside them.
    let started = Instant::now();
    let mut last = 0;
    while started.elapsed() < 40 * heartbeat {
        let guard = client.lock("orders/42").acquire().await.unwrap();
        assert!(guard.fencing_token() > last);
        last = guard.fencing_token();
        guard.release().await.unwrap();
    }
    client.close().await.unwrap();

    let firsts: Vec<Vec<u8>> = openings
        .lock()
        .unwrap()
        .iter()
        .map(|first| first.lock().unwrap().clone())
        .collect();
    let framed = firsts.iter().filter(|f| f[..] == APPEND_MAGIC[..]).count();
    // One towards each follower, and a second when a heartbeat overlaps a
    // replication session; a few more if the first election took two
    // rounds. A connection per session would be eighty and more.
    assert!(
        (2..=12).contains(&framed),
        "{framed} framed replication connections among {} the members opened",
        firsts.len()
    );
    for member in members {
        member.shutdown().await.unwrap();
    }
}

/// A replication stream opened by hand: the magic sent, the acceptance read.
async fn raw_append_stream(
    server: &Server,
) -> tokio_util::codec::Framed<TcpStream, LengthDelimitedCodec> {
    let mut tcp = TcpStream::connect(server.local_addr()).await.unwrap();
    tcp.write_all(APPEND_MAGIC).await.unwrap();
    let mut frames = tokio_util::codec::Framed::new(tcp, framed::codec(u32::MAX as usize));
    assert!(matches!(next_frame(&mut frames).await, Kind::Accepted(_)));
    frames
}

async fn next_frame(
    frames: &mut tokio_util::codec::Framed<TcpStream, LengthDelimitedCodec>,
) -> Kind {
    next_sequenced(frames).await.1
}

/// The next frame and the sequence number it carries.
async fn next_sequenced(
    frames: &mut tokio_util::codec::Framed<TcpStream, LengthDelimitedCodec>,
) -> (u64, Kind) {
    let frame = tokio::time::timeout(Duration::from_secs(10), frames.next())
        .await
        .expect("a frame in time")
        .expect("a frame, not the connection's end")
        .expect("a frame that reads");
    let frame = framed::decode::<AppendFrame>(&frame).unwrap();
    (frame.seq, frame.kind.unwrap())
}

/// Appends a leader's frame: its sequence number, then `request`.
fn put_leader_frame(buf: &mut BytesMut, seq: u64, request: &[u8]) {
    buf.put_u32(8 + request.len() as u32);
    buf.put_u64(seq);
    buf.put_slice(request);
}

/// The end of a session, or of the stream, as the follower sent it, and
/// the sequence number it carries.
async fn sequenced_end(
    frames: &mut tokio_util::codec::Framed<TcpStream, LengthDelimitedCodec>,
) -> (u64, AppendEnd) {
    match next_sequenced(frames).await {
        (seq, Kind::End(end)) => (seq, end),
        other => panic!("expected an end, got {other:?}"),
    }
}

async fn end_of(
    frames: &mut tokio_util::codec::Framed<TcpStream, LengthDelimitedCodec>,
) -> AppendEnd {
    sequenced_end(frames).await.1
}

/// What a leader sends is checked before openraft sees it: a session
/// without requests ends at once and the connection goes on; a request
/// that does not decode, a frame out of sequence (one went missing), or a
/// frame over the member's limit ends the session with the sender's error
/// and closes the connection; the member serves on.
#[tokio::test]
async fn a_replication_stream_refuses_what_does_not_decode_and_the_member_serves_on() {
    let server = crate::session_stream::server_with(|_| {}).await;

    let mut frames = raw_append_stream(&server).await;
    for seq in 0..2 {
        let mut buf = BytesMut::new();
        put_leader_frame(&mut buf, seq, &[]);
        frames.get_mut().write_all(&buf).await.unwrap();
        let (ended_by, end) = sequenced_end(&mut frames).await;
        assert_eq!((end.code, end.closing), (0, false), "{end:?}");
        assert_eq!(
            ended_by, seq,
            "the end names the frame that ended the session"
        );
    }
    let mut buf = BytesMut::new();
    put_leader_frame(&mut buf, 2, &[0xff, 0xff, 0xff]);
    frames.get_mut().write_all(&buf).await.unwrap();
    let end = end_of(&mut frames).await;
    assert_eq!(end.code, Code::InvalidArgument as i32, "{end:?}");
    assert!(
        end.message.contains("does not decode") && end.closing,
        "{end:?}"
    );
    assert!(frames.next().await.is_none(), "the connection is closed");

    // Frame 1 never came.
    let mut frames = raw_append_stream(&server).await;
    let mut buf = BytesMut::new();
    put_leader_frame(&mut buf, 0, &[]);
    put_leader_frame(&mut buf, 2, &[]);
    frames.get_mut().write_all(&buf).await.unwrap();
    assert_eq!(end_of(&mut frames).await.code, 0);
    let end = end_of(&mut frames).await;
    assert_eq!(end.code, Code::DataLoss as i32, "{end:?}");
    assert!(
        end.message.contains("expected frame 1, got 2") && end.closing,
        "{end:?}"
    );
    assert!(frames.next().await.is_none(), "the connection is closed");

    let mut frames = raw_append_stream(&server).await;
    frames
        .get_mut()
        .write_all(&[0xff, 0xff, 0xff, 0xf0])
        .await
        .unwrap();
    let end = end_of(&mut frames).await;
    assert_eq!(end.code, Code::OutOfRange as i32, "{end:?}");
    assert!(frames.next().await.is_none(), "the connection is closed");

    let client = Client::connect(&server.url()).await.unwrap();
    let guard = client.lock("still/serving").acquire().await.unwrap();
    guard.release().await.unwrap();
    client.close().await.unwrap();
    server.shutdown().await.unwrap();
}
