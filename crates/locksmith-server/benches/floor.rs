//! The floor under the lock server's latency on this machine: what one round
//! trip costs at one client over loopback before any lock work, side by side
//! in one run with the server's own acquire.
//!
//! Each measurement is a loop of round trips at one client, one after the
//! other, on loopback (p50 and p99 of each, and the rate):
//!
//! - `grpc unary echo`: a tonic server that answers `AcquireLease` at once
//!   (the locksmith API's own messages and codec, nothing behind them);
//! - `grpc stream echo`: the same server's `Session`, answering each
//!   `ClientBatch` (one heartbeat) with a `ServerBatch` (its ack), as a
//!   session stream carries a request and its reply;
//! - the same stream echo with its replies read by a task of their own and
//!   handed to the caller on a oneshot channel, as the client library's
//!   session driver hands replies to its callers: what that hop costs;
//! - `framed TCP echo`: the same batches, each way one prost message behind
//!   a length (`LengthDelimitedCodec`) on a plain TCP connection, the server
//!   a task per connection: the messages' own cost without HTTP/2 and gRPC,
//!   what a transport of the project's own would start from;
//! - `redis PING`: through the `redis` crate (the client the Redis lock
//!   backend uses), and `redis-benchmark -t ping -c 1` (Redis's own C
//!   client, its p50 as it reports it);
//! - the lock server (a group of one without a data directory: its Raft
//!   log on `/dev/shm`, so the disk is left out and only software is
//!   measured): a session acquire and its release over the raw gRPC stream,
//!   the same through the client library (`Lock::acquire`,
//!   `Guard::release`), and a sessionless `AcquireLease` + `Release` pair.
//!
//! Then the same at 64 clients, each on a connection of its own, for what
//! the **server** spends: its runtime's CPU per stream round trip of the
//! echo, and per acquire + release pair of the lock server through the
//! client library (two round trips); the framed echo likewise. The echoes
//! and the lock server each run
//! on a runtime of their own with the lock server's default of one worker,
//! so each one's threads are counted apart from the clients'.
//!
//! `cargo bench -p locksmith-server --bench floor`. `LOCKSMITH_FLOOR_SECS`
//! (default 2) is the length of each measurement; `LOCKSMITH_FLOOR_ROUNDS`
//! (default 3) runs them all that many times in turn, so that a noisy
//! moment on the machine hits every side alike, and reports the round with
//! the median p50 of each. The run prints the load average at its start and
//! end.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{SinkExt, Stream, StreamExt};
use locksmith::{Client, ConnectOptions};
use locksmith_proto::prost::Message;
use locksmith_proto::v1 as pb;
use locksmith_proto::v1::locksmith_client::LocksmithClient;
use locksmith_proto::v1::locksmith_server::{Locksmith, LocksmithServer};
use locksmith_server::{Server, ServerConfig};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::codec::{Framed, LengthDelimitedCodec};
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

mod common;
use common::{load_average, BoxError};

/// Round trips of one measurement, in microseconds.
struct Trips {
    micros: Vec<f64>,
    seconds: f64,
}

impl Trips {
    fn percentile(&self, p: f64) -> f64 {
        let mut sorted = self.micros.clone();
        sorted.sort_by(f64::total_cmp);
        match sorted.len() {
            0 => f64::NAN,
            n => sorted[((n - 1) as f64 * p).round() as usize],
        }
    }

    fn per_second(&self) -> f64 {
        self.micros.len() as f64 / self.seconds
    }
}

/// Times `trip` over and over for `duration` (after a short warm-up).
async fn measure(
    duration: Duration,
    mut trip: impl AsyncFnMut() -> Result<(), BoxError>,
) -> Result<Trips, BoxError> {
    let warm_up = Instant::now();
    while warm_up.elapsed() < Duration::from_millis(200) {
        trip().await?;
    }
    let mut micros = Vec::new();
    let started = Instant::now();
    while started.elapsed() < duration {
        let t = Instant::now();
        trip().await?;
        micros.push(t.elapsed().as_nanos() as f64 / 1_000.0);
    }
    Ok(Trips {
        micros,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The echo server: the locksmith API answered at once, with nothing behind
/// it. Only the two calls measured answer; the rest are not implemented.
struct Echo;

type BatchStream = Pin<Box<dyn Stream<Item = Result<pb::ServerBatch, Status>> + Send>>;

#[tonic::async_trait]
impl Locksmith for Echo {
    type SessionStream = BatchStream;

    async fn session(
        &self,
        request: Request<Streaming<pb::ClientBatch>>,
    ) -> Result<Response<BatchStream>, Status> {
        let mut incoming = request.into_inner();
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(async move {
            while let Some(Ok(batch)) = incoming.next().await {
                if tx.send(Ok(echo_reply(&batch))).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    type SessionsStream =
        Pin<Box<dyn Stream<Item = Result<pb::ServerChannelBatches, Status>> + Send>>;

    async fn sessions(
        &self,
        _: Request<Streaming<pb::ClientChannelBatches>>,
    ) -> Result<Response<Self::SessionsStream>, Status> {
        Err(Status::unimplemented("not measured"))
    }

    async fn acquire_lease(
        &self,
        _: Request<pb::AcquireLeaseRequest>,
    ) -> Result<Response<pb::AcquireLeaseResponse>, Status> {
        Ok(Response::new(pb::AcquireLeaseResponse {
            granted: true,
            tokens: vec![1],
            timed_out: false,
        }))
    }

    async fn release(
        &self,
        _: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        Err(Status::unimplemented("echo"))
    }

    async fn renew(
        &self,
        _: Request<pb::RenewRequest>,
    ) -> Result<Response<pb::RenewResponse>, Status> {
        Err(Status::unimplemented("echo"))
    }

    async fn describe(
        &self,
        _: Request<pb::DescribeRequest>,
    ) -> Result<Response<pb::DescribeResponse>, Status> {
        Err(Status::unimplemented("echo"))
    }

    async fn list(
        &self,
        _: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ListResponse>, Status> {
        Err(Status::unimplemented("echo"))
    }

    async fn list_sessions(
        &self,
        _: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsResponse>, Status> {
        Err(Status::unimplemented("echo"))
    }

    async fn end_session(
        &self,
        _: Request<pb::EndSessionRequest>,
    ) -> Result<Response<pb::EndSessionResponse>, Status> {
        Err(Status::unimplemented("echo"))
    }

    async fn force_release(
        &self,
        _: Request<pb::ForceReleaseRequest>,
    ) -> Result<Response<pb::ForceReleaseResponse>, Status> {
        Err(Status::unimplemented("echo"))
    }

    async fn close_session(
        &self,
        _: Request<pb::CloseSessionRequest>,
    ) -> Result<Response<pb::CloseSessionResponse>, Status> {
        Err(Status::unimplemented("echo"))
    }

    async fn history(
        &self,
        _: Request<pb::HistoryRequest>,
    ) -> Result<Response<pb::HistoryResponse>, Status> {
        Err(Status::unimplemented("echo"))
    }
}

/// What the echoes answer a batch with: a heartbeat's ack for each message.
fn echo_reply(batch: &pb::ClientBatch) -> pb::ServerBatch {
    let messages = batch
        .messages
        .iter()
        .map(|_| pb::ServerMessage {
            kind: Some(pb::server_message::Kind::Heartbeat(pb::HeartbeatAck {
                now_ms: 1,
            })),
        })
        .collect();
    pb::ServerBatch { messages }
}

/// Starts the framed echo on a loopback port (a task per connection,
/// answering each `ClientBatch` frame with a `ServerBatch` frame); returns
/// its address.
///
/// Cancel safety: dropped before it returns, no echo listens.
async fn start_framed_echo() -> Result<std::net::SocketAddr, BoxError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let _ = tcp.set_nodelay(true);
            tokio::spawn(async move {
                let mut framed = Framed::new(tcp, LengthDelimitedCodec::new());
                while let Some(Ok(frame)) = framed.next().await {
                    let Ok(batch) = pb::ClientBatch::decode(frame) else {
                        return;
                    };
                    let reply = echo_reply(&batch).encode_to_vec();
                    if framed.send(bytes::Bytes::from(reply)).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Ok(addr)
}

/// A client of the framed echo.
struct FramedStream(Framed<tokio::net::TcpStream, LengthDelimitedCodec>);

impl FramedStream {
    /// Cancel safety: safe; a dropped connect leaves nothing.
    async fn open(addr: std::net::SocketAddr) -> Result<FramedStream, BoxError> {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        Ok(FramedStream(Framed::new(tcp, LengthDelimitedCodec::new())))
    }

    /// Sends `messages` as one batch; returns the batch that comes back.
    ///
    /// Cancel safety: not safe; dropped after sending, its reply is left
    /// for the next trip to read. The bench never drops one.
    async fn trip(
        &mut self,
        messages: Vec<pb::ClientMessage>,
    ) -> Result<pb::ServerBatch, BoxError> {
        let batch = pb::ClientBatch {
            messages,
            ack_replies: Vec::new(),
            ack_lost: Vec::new(),
        };
        self.0
            .send(bytes::Bytes::from(batch.encode_to_vec()))
            .await?;
        let frame = self.0.next().await.ok_or("the echo closed")??;
        Ok(pb::ServerBatch::decode(frame)?)
    }
}

/// Starts the echo server on a loopback port; returns its address.
async fn start_echo() -> Result<String, BoxError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let incoming = futures::stream::unfold(listener, |listener| async {
        let accepted = listener.accept().await.map(|(tcp, _)| {
            let _ = tcp.set_nodelay(true);
            tcp
        });
        Some((accepted, listener))
    });
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(LocksmithServer::new(Echo))
            .serve_with_incoming(incoming),
    );
    Ok(format!("http://{addr}"))
}

async fn channel(addr: &str) -> Result<LocksmithClient<Channel>, BoxError> {
    let channel = Channel::from_shared(addr.to_owned())?
        .tcp_nodelay(true)
        .connect()
        .await?;
    Ok(LocksmithClient::new(channel))
}

/// A session stream over the raw API: batches go out on `tx`, come back on
/// `rx`.
struct RawStream {
    tx: mpsc::Sender<pb::ClientBatch>,
    rx: Streaming<pb::ServerBatch>,
}

impl RawStream {
    async fn open(client: &mut LocksmithClient<Channel>) -> Result<RawStream, BoxError> {
        let (tx, outgoing) = mpsc::channel(16);
        let rx = client
            .session(ReceiverStream::new(outgoing))
            .await?
            .into_inner();
        Ok(RawStream { tx, rx })
    }

    /// Sends `messages` (acknowledging `ack`) as one batch; returns the next
    /// batch that comes back.
    async fn trip(
        &mut self,
        messages: Vec<pb::ClientMessage>,
        ack: Option<u64>,
    ) -> Result<pb::ServerBatch, BoxError> {
        let batch = pb::ClientBatch {
            messages,
            ack_replies: ack.into_iter().collect(),
            ack_lost: Vec::new(),
        };
        self.tx.send(batch).await?;
        Ok(self.rx.message().await?.ok_or("the stream ended")?)
    }
}

/// A session stream whose replies come through a reader task, as the
/// client library's do: the caller sends, the reader reads every batch and
/// hands each to the caller on a oneshot channel.
struct ReadByTask {
    tx: mpsc::Sender<pb::ClientBatch>,
    waiting: Waiting,
}

/// Where the reader hands the next batch.
type Waiting = Arc<std::sync::Mutex<Option<oneshot::Sender<pb::ServerBatch>>>>;

impl ReadByTask {
    async fn open(client: &mut LocksmithClient<Channel>) -> Result<ReadByTask, BoxError> {
        let RawStream { tx, mut rx } = RawStream::open(client).await?;
        let waiting = Waiting::default();
        let reader = waiting.clone();
        tokio::spawn(async move {
            while let Ok(Some(batch)) = rx.message().await {
                if let Some(waiter) = reader.lock().unwrap().take() {
                    let _ = waiter.send(batch);
                }
            }
        });
        Ok(ReadByTask { tx, waiting })
    }

    async fn trip(
        &mut self,
        messages: Vec<pb::ClientMessage>,
    ) -> Result<pb::ServerBatch, BoxError> {
        let (waiter, reply) = oneshot::channel();
        *self.waiting.lock().unwrap() = Some(waiter);
        let batch = pb::ClientBatch {
            messages,
            ack_replies: Vec::new(),
            ack_lost: Vec::new(),
        };
        self.tx.send(batch).await?;
        Ok(reply.await?)
    }
}

fn message(kind: pb::client_message::Kind) -> pb::ClientMessage {
    pb::ClientMessage { kind: Some(kind) }
}

fn heartbeat() -> pb::ClientMessage {
    message(pb::client_message::Kind::Heartbeat(pb::Heartbeat {}))
}

fn request(id: u64, op: pb::request::Op) -> pb::ClientMessage {
    message(pb::client_message::Kind::Request(pb::Request {
        id,
        op: Some(op),
    }))
}

fn acquire(name: &str, lease_ms: Option<u64>) -> pb::Acquire {
    pb::Acquire {
        names: vec![name.to_owned()],
        owner: "floor".into(),
        lease_ms,
        ..pb::Acquire::default()
    }
}

/// Whether `batch` carries the final reply of request `id`.
fn answers(batch: &pb::ServerBatch, id: u64) -> bool {
    batch.messages.iter().any(|m| match &m.kind {
        Some(pb::server_message::Kind::Reply(reply)) => {
            reply.id == id && !matches!(reply.result, Some(pb::reply::Result::Queued(_)))
        }
        _ => false,
    })
}

/// The p50 and p99 of the session acquires and of the releases, over the
/// raw stream.
async fn raw_session_pairs(addr: &str, duration: Duration) -> Result<(Trips, Trips), BoxError> {
    let mut client = channel(addr).await?;
    let mut stream = RawStream::open(&mut client).await?;
    let open = pb::OpenSession {
        client_name: "floor".into(),
        host: String::new(),
        ttl_ms: 30_000,
    };
    stream
        .trip(vec![message(pb::client_message::Kind::Open(open))], None)
        .await?;
    let name = format!("floor/raw/{}", uuid::Uuid::new_v4().simple());
    let (mut acquires, mut id, mut ack) = (Vec::new(), 0, None);
    let releases = measure(duration, async || {
        id += 2;
        let (acquire_id, release_id) = (id, id + 1);
        let acked = ack.replace(release_id);
        let t = Instant::now();
        let op = pb::request::Op::Acquire(acquire(&name, None));
        let mut reply = stream.trip(vec![request(acquire_id, op)], acked).await?;
        while !answers(&reply, acquire_id) {
            reply = stream.rx.message().await?.ok_or("the stream ended")?;
        }
        acquires.push(t.elapsed().as_nanos() as f64 / 1_000.0);
        let release = pb::Release {
            name: name.clone(),
            owner: "floor".into(),
            token: None,
        };
        let op = pb::request::Op::Release(release);
        let mut reply = stream
            .trip(vec![request(release_id, op)], Some(acquire_id))
            .await?;
        while !answers(&reply, release_id) {
            reply = stream.rx.message().await?.ok_or("the stream ended")?;
        }
        Ok(())
    })
    .await?;
    // `releases` timed whole pairs: a release is the pair less its acquire.
    let pairs = releases.micros.len();
    let acquired = acquires.split_off(acquires.len() - pairs);
    let release_micros = releases
        .micros
        .iter()
        .zip(&acquired)
        .map(|(pair, acquire)| pair - acquire)
        .collect();
    Ok((
        Trips {
            micros: acquired,
            seconds: releases.seconds,
        },
        Trips {
            micros: release_micros,
            seconds: releases.seconds,
        },
    ))
}

/// Session acquires and releases through the client library.
async fn library_pairs(url: &str, duration: Duration) -> Result<(Trips, Trips), BoxError> {
    let options = ConnectOptions::default()
        .session_ttl(Duration::from_secs(30))
        .client_name("floor");
    let client = Client::connect_with(url, options).await?;
    let lock = client.lock(format!("floor/lib/{}", uuid::Uuid::new_v4().simple()));
    let mut acquires = Vec::new();
    let pairs = measure(duration, async || {
        let t = Instant::now();
        let guard = lock.acquire().await?;
        acquires.push(t.elapsed().as_nanos() as f64 / 1_000.0);
        guard.release().await?;
        Ok(())
    })
    .await?;
    let acquired = acquires.split_off(acquires.len() - pairs.micros.len());
    let releases = pairs
        .micros
        .iter()
        .zip(&acquired)
        .map(|(pair, acquire)| pair - acquire)
        .collect();
    let seconds = pairs.seconds;
    client.close().await?;
    Ok((
        Trips {
            micros: acquired,
            seconds,
        },
        Trips {
            micros: releases,
            seconds,
        },
    ))
}

/// The clients of the measurements of the server's CPU.
const MANY: usize = 64;

/// Workers of the echo's and the lock server's runtimes: the lock server's
/// default.
const SERVER_WORKERS: usize = 1;

/// What `MANY` clients got and what they cost the server's threads.
struct Load {
    per_second: f64,
    cpu_us: f64,
}

/// Runs `MANY` clients of `client` (each loops, counting what it
/// completes, until told to stop) for `duration` after a warm-up; counts
/// the CPU of the threads named `server_threads` over that time.
async fn many<F, Fut>(server_threads: &str, duration: Duration, client: F) -> Result<Load, BoxError>
where
    F: Fn(Arc<AtomicBool>, Arc<AtomicU64>) -> Fut,
    Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..MANY)
        .map(|_| tokio::spawn(client(stop.clone(), count.clone())))
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let server = |name: &str, _: &str| name == server_threads;
    let (counted, before, started) = (
        count.load(Ordering::SeqCst),
        common::spent_by(server),
        Instant::now(),
    );
    tokio::time::sleep(duration).await;
    let (done, after, elapsed) = (
        count.load(Ordering::SeqCst) - counted,
        common::spent_by(server),
        started.elapsed(),
    );
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await??;
    }
    Ok(Load {
        per_second: done as f64 / elapsed.as_secs_f64(),
        cpu_us: (after.cpu - before.cpu).as_nanos() as f64 / 1_000.0 / done.max(1) as f64,
    })
}

/// `MANY` stream echoes: each client a connection and a stream of its own,
/// one heartbeat batch each way per round trip.
async fn many_echoes(addr: &str, duration: Duration) -> Result<Load, BoxError> {
    many("echo", duration, |stop, count| {
        let addr = addr.to_owned();
        async move {
            let mut client = channel(&addr).await?;
            let mut stream = RawStream::open(&mut client).await?;
            while !stop.load(Ordering::Relaxed) {
                stream.trip(vec![heartbeat()], None).await?;
                count.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        }
    })
    .await
}

/// `MANY` framed echoes: each client a connection of its own, one batch
/// each way per round trip.
///
/// Cancel safety: dropped, its clients run on until the runtime ends.
async fn many_framed_echoes(
    addr: std::net::SocketAddr,
    duration: Duration,
) -> Result<Load, BoxError> {
    many("framed", duration, |stop, count| async move {
        let mut stream = FramedStream::open(addr).await?;
        while !stop.load(Ordering::Relaxed) {
            stream.trip(vec![heartbeat()]).await?;
            count.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    })
    .await
}

/// `MANY` clients of the lock server, each a connection and a lock of its
/// own, taking and releasing it through the client library.
async fn many_pairs(url: &str, duration: Duration) -> Result<Load, BoxError> {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let next = AtomicU64::new(0);
    many("server", duration, |stop, count| {
        let url = url.to_owned();
        let name = format!("floor/many/{run}/{}", next.fetch_add(1, Ordering::Relaxed));
        async move {
            let options = ConnectOptions::default()
                .session_ttl(Duration::from_secs(30))
                .client_name("floor");
            let client = Client::connect_with(&url, options).await?;
            let lock = client.lock(name);
            while !stop.load(Ordering::Relaxed) {
                lock.acquire().await?.release().await?;
                count.fetch_add(1, Ordering::Relaxed);
            }
            client.close().await?;
            Ok(())
        }
    })
    .await
}

/// The round with the median CPU of `rounds`, and every round's CPU.
fn report_load(label: &str, unit: &str, mut rounds: Vec<Load>) {
    rounds.sort_by(|a, b| a.cpu_us.total_cmp(&b.cpu_us));
    let each: Vec<String> = rounds.iter().map(|l| format!("{:.1}", l.cpu_us)).collect();
    let median = &rounds[rounds.len() / 2];
    println!(
        "{label:<44} {:>7.1} µs of the server's CPU per {unit}  {:>8.0} {unit}s/s  (each round: {} µs)",
        median.cpu_us,
        median.per_second,
        each.join(", ")
    );
}

/// `redis-benchmark -t ping -c 1`: its p50 of `PING_MBULK`, in microseconds.
fn redis_benchmark(port: u16) -> Result<(f64, f64), BoxError> {
    let out = std::process::Command::new("redis-benchmark")
        .args([
            "-p",
            &port.to_string(),
            "-t",
            "ping",
            "-c",
            "1",
            "-n",
            "20000",
            "--csv",
        ])
        .output()?;
    let text = String::from_utf8(out.stdout)?;
    // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms",...
    let line = text
        .lines()
        .find(|l| l.starts_with("\"PING_MBULK\""))
        .ok_or_else(|| format!("no PING_MBULK line in redis-benchmark's output: {text}"))?;
    let fields: Vec<f64> = line
        .split(',')
        .skip(1)
        .map(|f| f.trim_matches('"').parse().unwrap_or(f64::NAN))
        .collect();
    Ok((fields[0], fields[3] * 1_000.0))
}

/// One line of the report: the round whose p50 is the median of the rounds.
fn report(label: &str, mut rounds: Vec<Trips>) {
    rounds.sort_by(|a, b| a.percentile(0.5).total_cmp(&b.percentile(0.5)));
    let p50s: Vec<String> = rounds
        .iter()
        .map(|t| format!("{:.0}", t.percentile(0.5)))
        .collect();
    let median = &rounds[rounds.len() / 2];
    println!(
        "{label:<44} p50 {:>7.1} µs  p99 {:>7.1} µs  {:>8.0}/s  (p50 of each round: {})",
        median.percentile(0.5),
        median.percentile(0.99),
        median.per_second(),
        p50s.join(", ")
    );
}

fn main() -> Result<(), BoxError> {
    let (duration, rounds) =
        common::duration_and_rounds("LOCKSMITH_FLOOR_SECS", 2, "LOCKSMITH_FLOOR_ROUNDS", 3);

    let echo_runtime = locksmith_server::runtime::build(SERVER_WORKERS, "echo")?;
    let echo = echo_runtime.block_on(start_echo())?;
    let framed_runtime = locksmith_server::runtime::build(SERVER_WORKERS, "framed")?;
    let framed = framed_runtime.block_on(start_framed_echo())?;
    let server_runtime = locksmith_server::runtime::build(SERVER_WORKERS, "server")?;
    let config = ServerConfig::in_memory().listen("127.0.0.1:0".parse()?);
    let server = server_runtime.block_on(Server::start(config))?;
    let url = server.url();
    let server_addr = format!("http://{}", server.local_addr());
    let redis = locksmith_testkit::Redis::start();
    let clients = common::runtime("clients")?;
    eprintln!(
        "one client, loopback; {} s per measurement, {rounds} rounds; load average {}",
        duration.as_secs(),
        load_average()
    );

    #[derive(Default)]
    struct All {
        unary_echo: Vec<Trips>,
        stream_echo: Vec<Trips>,
        stream_echo_reader: Vec<Trips>,
        framed_echo: Vec<Trips>,
        redis_ping: Vec<Trips>,
        redis_benchmark: Vec<(f64, f64)>,
        raw_acquire: Vec<Trips>,
        raw_release: Vec<Trips>,
        library_acquire: Vec<Trips>,
        library_release: Vec<Trips>,
        lease_acquire: Vec<Trips>,
        many_echoes: Vec<Load>,
        many_framed_echoes: Vec<Load>,
        many_pairs: Vec<Load>,
    }
    let mut all = All::default();
    clients.block_on(async {
        for round in 1..=rounds {
            eprintln!("round {round} of {rounds}; load average {}", load_average());
            let mut echo_client = channel(&echo).await?;
            all.unary_echo.push(
                measure(duration, async || {
                    let request = pb::AcquireLeaseRequest {
                        acquire: Some(acquire("floor/echo", Some(1_000))),
                    };
                    echo_client.acquire_lease(request).await?;
                    Ok(())
                })
                .await?,
            );
            let mut stream = RawStream::open(&mut echo_client).await?;
            all.stream_echo.push(
                measure(duration, async || {
                    stream.trip(vec![heartbeat()], None).await?;
                    Ok(())
                })
                .await?,
            );
            drop(stream);
            let mut read_by_task = ReadByTask::open(&mut echo_client).await?;
            all.stream_echo_reader.push(
                measure(duration, async || {
                    read_by_task.trip(vec![heartbeat()]).await?;
                    Ok(())
                })
                .await?,
            );
            drop(read_by_task);
            let mut framed_stream = FramedStream::open(framed).await?;
            all.framed_echo.push(
                measure(duration, async || {
                    framed_stream.trip(vec![heartbeat()]).await?;
                    Ok(())
                })
                .await?,
            );
            drop(framed_stream);
            let redis_client = redis::Client::open(redis.url())?;
            let mut connection = redis_client.get_multiplexed_async_connection().await?;
            all.redis_ping.push(
                measure(duration, async || {
                    let _: String = redis::cmd("PING").query_async(&mut connection).await?;
                    Ok(())
                })
                .await?,
            );
            all.redis_benchmark.push(redis_benchmark(redis.port())?);
            let (acquires, releases) = raw_session_pairs(&server_addr, duration).await?;
            all.raw_acquire.push(acquires);
            all.raw_release.push(releases);
            let (acquires, releases) = library_pairs(&url, duration).await?;
            all.library_acquire.push(acquires);
            all.library_release.push(releases);
            let mut lease_client = channel(&server_addr).await?;
            let name = format!("floor/lease/{}", uuid::Uuid::new_v4().simple());
            all.lease_acquire.push(
                measure(duration, async || {
                    let request = pb::AcquireLeaseRequest {
                        acquire: Some(acquire(&name, Some(10_000))),
                    };
                    let granted = lease_client.acquire_lease(request).await?.into_inner();
                    if !granted.granted {
                        return Err("the lease was not granted".into());
                    }
                    let release = pb::ReleaseRequest {
                        release: Some(pb::Release {
                            name: name.clone(),
                            owner: "floor".into(),
                            token: None,
                        }),
                    };
                    // Not timed apart: a sessionless pair.
                    lease_client.release(release).await?;
                    Ok(())
                })
                .await?,
            );
            all.many_echoes.push(many_echoes(&echo, duration).await?);
            all.many_framed_echoes
                .push(many_framed_echoes(framed, duration).await?);
            all.many_pairs.push(many_pairs(&url, duration).await?);
        }
        Ok::<(), BoxError>(())
    })?;
    eprintln!("load average at the end {}", load_average());

    println!("one client, loopback, round trips:");
    report("gRPC unary echo (tonic)", all.unary_echo);
    report(
        "gRPC stream echo (tonic, one batch each way)",
        all.stream_echo,
    );
    report(
        "gRPC stream echo, replies through a reader task",
        all.stream_echo_reader,
    );
    report("framed TCP echo (length-delimited prost)", all.framed_echo);
    report("Redis PING (redis crate)", all.redis_ping);
    let mut bench = all.redis_benchmark;
    bench.sort_by(|a, b| a.1.total_cmp(&b.1));
    let (rps, p50) = bench[bench.len() / 2];
    println!(
        "{:<44} p50 {p50:>7.1} µs  {rps:>20.0}/s  (redis-benchmark's own figures)",
        "Redis PING (redis-benchmark -t ping -c 1)"
    );
    report("server: session acquire, raw stream", all.raw_acquire);
    report("server: session release, raw stream", all.raw_release);
    report("server: acquire, client library", all.library_acquire);
    report("server: release, client library", all.library_release);
    report("server: AcquireLease + Release (unary)", all.lease_acquire);
    println!("{MANY} clients, each a connection of its own:");
    report_load("gRPC stream echo", "trip", all.many_echoes);
    report_load("framed TCP echo", "trip", all.many_framed_echoes);
    report_load(
        "server: acquire + release, client library",
        "pair",
        all.many_pairs,
    );
    clients.block_on(async move { drop(server) });
    Ok(())
}
