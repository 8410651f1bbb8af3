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
use locksmith_proto::raft::{append_frame::Kind, AppendFrame};
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
    let frame = tokio::time::timeout(Duration::from_secs(10), frames.next())
        .await
        .expect("a frame in time")
        .expect("a frame, not the connection's end")
        .expect("a frame that reads");
    framed::decode::<AppendFrame>(&frame).unwrap().kind.unwrap()
}

/// What a leader sends is checked before openraft sees it: a session
/// without requests ends at once and the connection goes on; a request
/// that does not decode, or a frame over the member's limit, ends the
/// session with the sender's error and closes the connection; the member
/// serves on.
#[tokio::test]
async fn a_replication_stream_refuses_what_does_not_decode_and_the_member_serves_on() {
    let server = crate::session_stream::server_with(|_| {}).await;

    let mut frames = raw_append_stream(&server).await;
    for _ in 0..2 {
        frames.get_mut().write_all(&[0, 0, 0, 0]).await.unwrap();
        let Kind::End(end) = next_frame(&mut frames).await else {
            panic!("an empty session ends");
        };
        assert_eq!((end.code, end.closing), (0, false), "{end:?}");
    }
    let mut garbage = BytesMut::new();
    garbage.put_u32(3);
    garbage.put_slice(&[0xff, 0xff, 0xff]);
    frames.get_mut().write_all(&garbage).await.unwrap();
    let Kind::End(end) = next_frame(&mut frames).await else {
        panic!("a request that does not decode ends the session");
    };
    assert_eq!(end.code, Code::InvalidArgument as i32, "{end:?}");
    assert!(
        end.message.contains("does not decode") && end.closing,
        "{end:?}"
    );
    assert!(frames.next().await.is_none(), "the connection is closed");

    let mut frames = raw_append_stream(&server).await;
    frames
        .get_mut()
        .write_all(&[0xff, 0xff, 0xff, 0xf0])
        .await
        .unwrap();
    let Kind::End(end) = next_frame(&mut frames).await else {
        panic!("a frame over the limit ends the session");
    };
    assert_eq!(end.code, Code::OutOfRange as i32, "{end:?}");
    assert!(frames.next().await.is_none(), "the connection is closed");

    let client = Client::connect(&server.url()).await.unwrap();
    let guard = client.lock("still/serving").acquire().await.unwrap();
    guard.release().await.unwrap();
    client.close().await.unwrap();
    server.shutdown().await.unwrap();
}
