//! Starts the real `locksmith serve` binary for the server tests: one process
//! on a free loopback port with its own data directory, killed with the test
//! process (locksmith-testkit's [`Process`]: own process group,
//! `PR_SET_PDEATHSIG`), and kill -9 / graceful stop / restart on the same port
//! and data directory for the fault tests.
#![allow(dead_code)]

pub mod pki;

use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use locksmith::{Client, ConnectOptions};
use locksmith_testkit::{free_port, Process, ProcessSpec, START_MARKER};

/// The `locksmith` binary built with these tests.
pub const BINARY: &str = env!("CARGO_BIN_EXE_locksmith");

/// A `locksmith serve` process.
pub struct ServerProcess {
    process: Process,
    port: u16,
    dir: PathBuf,
    _temp: Option<tempfile::TempDir>,
}

impl ServerProcess {
    /// A durable server in a new temporary data directory.
    pub fn start() -> ServerProcess {
        Self::start_with(&[])
    }

    /// A durable server with extra `serve` arguments.
    pub fn start_with(extra: &[&str]) -> ServerProcess {
        Self::start_prepared(|_| {}, extra)
    }

    /// A durable server with extra `serve` arguments, whose data directory
    /// `prepare` sets up first (it gets the path, which does not exist yet).
    pub fn start_prepared(prepare: impl FnOnce(&Path), extra: &[&str]) -> ServerProcess {
        // Under cargo's target/tmp: a server shared through a static is never
        // dropped, so its directory stays behind for `cargo clean`.
        let temp = tempfile::Builder::new()
            .prefix("locksmith-serve-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .expect("temporary data directory");
        let dir = temp.path().to_owned();
        prepare(&dir.join("data"));
        let mut server = Self::spawn(&dir, extra);
        server._temp = Some(temp);
        server
    }

    /// A durable server on `port` (a member of a cluster whose addresses
    /// are fixed in advance), in a new temporary data directory.
    pub fn start_on(port: u16, extra: &[&str]) -> ServerProcess {
        let temp = tempfile::Builder::new()
            .prefix("locksmith-serve-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .expect("temporary data directory");
        let mut server = Self::spawn_on(temp.path(), port, extra);
        server._temp = Some(temp);
        server
    }

    /// A durable server on `port` whose data directory `prepare` sets up
    /// first (it gets the path, which does not exist yet).
    pub fn start_prepared_on(
        port: u16,
        prepare: impl FnOnce(&Path),
        extra: &[&str],
    ) -> ServerProcess {
        let temp = tempfile::Builder::new()
            .prefix("locksmith-serve-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .expect("temporary data directory");
        prepare(&temp.path().join("data"));
        let mut server = Self::spawn_on(temp.path(), port, extra);
        server._temp = Some(temp);
        server
    }

    /// Member `index + 1` of a new cluster whose members listen on `ports`
    /// on loopback, with `extra` arguments.
    pub fn start_member(ports: &[u16], index: usize, extra: &[&str]) -> ServerProcess {
        let id = (index + 1).to_string();
        let list = cluster_flag(ports);
        let mut args = vec!["--node-id", &id, "--cluster", &list];
        args.extend_from_slice(extra);
        ServerProcess::start_on(ports[index], &args)
    }

    /// A new cluster of three members on free loopback ports, each started
    /// with `extra` arguments.
    pub fn start_cluster(extra: &[&str]) -> Vec<ServerProcess> {
        let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        (0..3)
            .map(|i| ServerProcess::start_member(&ports, i, extra))
            .collect()
    }

    fn spawn(dir: &Path, extra: &[&str]) -> ServerProcess {
        Self::spawn_on(dir, free_port(), extra)
    }

    fn spawn_on(dir: &Path, port: u16, extra: &[&str]) -> ServerProcess {
        let data = dir.join("data");
        let spec = ProcessSpec::new(
            format!("locksmith serve on port {port}"),
            BINARY,
            dir.join("serve.log"),
        )
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .arg("--data-dir")
        .arg(&data)
        .args(extra);
        // The server's own default filter unless the run asks for another.
        let spec = match std::env::var("LOCKSMITH_SERVE_LOG") {
            Ok(filter) => spec.env("RUST_LOG", filter),
            Err(_) => spec.env_remove("RUST_LOG"),
        };
        let process = Process::spawn(spec).expect("start locksmith serve");
        let server = ServerProcess {
            process,
            port,
            dir: dir.to_owned(),
            _temp: None,
        };
        server.wait_ready();
        server
    }

    fn wait_ready(&self) {
        let port = self.port;
        let ready = self.process.wait_ready(Duration::from_secs(30), || {
            // Another test process may have been given the same free port:
            // only this server's own log line says it is this one listening.
            // All of this start's log: a member waiting for its peers' votes
            // may have logged many lines since.
            let log = std::fs::read_to_string(self.process.log_path()).unwrap_or_default();
            let this_start = log.rfind(START_MARKER).map_or(&log[..], |at| &log[at..]);
            if !listening_on(this_start, port) {
                return Err(format!(
                    "no \"listening\" line for port {port} in the log yet"
                ));
            }
            TcpStream::connect_timeout(
                &(Ipv4Addr::LOCALHOST, port).into(),
                Duration::from_millis(200),
            )
            .map(drop)
            .map_err(|e| e.to_string())
        });
        if let Err(error) = ready {
            panic!("{error}");
        }
    }

    /// `locksmith://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("locksmith://127.0.0.1:{}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id (while it runs).
    pub fn pid(&self) -> u32 {
        self.process.pid().expect("locksmith serve is running")
    }

    /// The data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// kill -9 of the server (its whole process group), reaped.
    pub fn kill(&self) {
        self.process.kill();
    }

    /// Freezes the server (SIGSTOP) until [`ServerProcess::unpause`].
    pub fn pause(&self) {
        self.process.pause();
    }

    /// Lets a paused server run again (SIGCONT).
    pub fn unpause(&self) {
        self.process.resume();
    }

    /// SIGTERM, waiting for a graceful exit (snapshot).
    pub fn stop(&self) {
        self.process.stop();
    }

    /// Starts the server again on the same port and data directory.
    pub fn restart(&self) {
        self.process.start().expect("restart locksmith serve");
        self.wait_ready();
    }

    /// Starts another server on this one's data directory (stop this one
    /// first), with extra `serve` arguments.
    pub fn start_again_with(&self, extra: &[&str]) -> ServerProcess {
        Self::spawn(&self.dir, extra)
    }

    /// Starts another server on this one's data directory and port (stop
    /// this one first), with extra `serve` arguments.
    pub fn start_again_on_port_with(&self, extra: &[&str]) -> ServerProcess {
        Self::spawn_on(&self.dir, self.port, extra)
    }

    /// Starts `locksmith serve` on this server's data directory (stop this
    /// one first), expecting it to refuse; returns what it printed.
    pub fn refused(&self, extra: &[&str]) -> String {
        refused_start(&self.data_dir(), extra)
    }

    /// The exit status if the server exited on its own.
    pub fn exit_status(&self) -> Option<std::process::ExitStatus> {
        self.process.try_exit_status()
    }

    /// The last lines of the server's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    /// Panics with the log tail if the server is not running.
    pub fn assert_running(&self) {
        assert!(
            self.process.is_running(),
            "locksmith serve exited: {:?}\n{}",
            self.exit_status(),
            self.log_tail(40)
        );
    }

    /// A client of the members on `ports` (session TTL 10 s).
    pub async fn client_of(ports: &[u16]) -> Client {
        let url = members_url(ports);
        let options = ConnectOptions::default().session_ttl(Duration::from_secs(10));
        Client::connect_with(&url, options)
            .await
            .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
    }

    /// A client with the given session TTL.
    pub async fn client(&self, session_ttl: Duration) -> Client {
        let options = ConnectOptions::default().session_ttl(session_ttl);
        Client::connect_with(&self.url(), options)
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}\n{}", self.url(), self.log_tail(20)))
    }
}

/// Whether `log` has the server's "listening" line for `port`.
fn listening_on(log: &str, port: u16) -> bool {
    let addr = format!("127.0.0.1:{port}");
    log.lines().any(|line| {
        line.contains("locksmith server listening")
            && line
                .match_indices(&addr)
                .any(|(at, _)| !line[at + addr.len()..].starts_with(|c: char| c.is_ascii_digit()))
    })
}

/// The index of the member that answers inspection (the leader), once one
/// does, among those not in `except`.
pub async fn leader(members: &[ServerProcess], except: &[usize]) -> usize {
    use locksmith_proto::v1 as pb;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        for (i, member) in members.iter().enumerate() {
            if except.contains(&i) {
                continue;
            }
            let address = format!("http://127.0.0.1:{}", member.port());
            let Ok(mut client) = pb::locksmith_client::LocksmithClient::connect(address).await
            else {
                continue;
            };
            let request = pb::DescribeRequest {
                name: "probe".into(),
            };
            if client.describe(request).await.is_ok() {
                return i;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no leader among the members"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `locksmith cluster status --json` of the cluster at `url`, as the member
/// it reaches first knows it (the leader knows what each member announced).
pub async fn cluster_status(url: &str) -> serde_json::Value {
    let url = url.to_owned();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(BINARY)
            .args(["cluster", "--backend", &url, "status", "--json"])
            .output()
            .expect("run locksmith cluster status")
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "cluster status: {text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// The record version each member announced, by id, as the leader knows it.
pub fn record_versions(status: &serde_json::Value) -> Vec<Option<u64>> {
    status["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["record_version"].as_u64())
        .collect()
}

/// The `locksmith://` URL of the servers on these loopback ports.
pub fn members_url(ports: &[u16]) -> String {
    let members: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    format!("locksmith://{}", members.join(","))
}

/// The `locksmith://` URL of these running servers (a cluster's members).
pub fn url_of(members: &[ServerProcess]) -> String {
    let ports: Vec<u16> = members.iter().map(ServerProcess::port).collect();
    members_url(&ports)
}

/// The `--cluster` value for members 1, 2, … listening on these loopback
/// ports, in that order.
pub fn cluster_flag(ports: &[u16]) -> String {
    ports
        .iter()
        .enumerate()
        .map(|(i, port)| format!("{}=127.0.0.1:{port}", i + 1))
        .collect::<Vec<_>>()
        .join(",")
}

/// A lock name unique to this run.
pub fn unique(test: &str) -> String {
    let run = uuid::Uuid::new_v4().simple().to_string();
    format!("server-tests/{}/{test}", &run[..8])
}

/// Polls `check` every 10 ms until it returns true, panicking after `limit`.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never happened: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A gRPC client of the server, for calls the library does not make.
pub async fn grpc(
    port: u16,
) -> locksmith_proto::v1::locksmith_client::LocksmithClient<tonic::transport::Channel> {
    locksmith_proto::v1::locksmith_client::LocksmithClient::connect(format!(
        "http://127.0.0.1:{port}"
    ))
    .await
    .expect("gRPC connect")
}

/// A session stream driven by hand: it heartbeats only when told to.
pub struct RawSession {
    tx: tokio::sync::mpsc::UnboundedSender<locksmith_proto::v1::ClientBatch>,
    inbound: tonic::Streaming<locksmith_proto::v1::ServerBatch>,
    /// Messages of a server batch not read yet.
    buffered: std::collections::VecDeque<locksmith_proto::v1::ServerMessage>,
    /// The session id from `opened`.
    pub session_id: u64,
    /// The resume secret from `opened`.
    pub secret: Vec<u8>,
}

/// Starts a session stream whose first message is `first` (alone in its
/// batch); returns the sender and the stream (or the call's error status).
pub async fn raw_stream(
    port: u16,
    first: locksmith_proto::v1::client_message::Kind,
) -> (
    tokio::sync::mpsc::UnboundedSender<locksmith_proto::v1::ClientBatch>,
    Result<tonic::Streaming<locksmith_proto::v1::ServerBatch>, tonic::Status>,
) {
    raw_stream_on(&mut grpc(port).await, first).await
}

/// Like [`raw_stream`], on an existing connection.
pub async fn raw_stream_on(
    client: &mut locksmith_proto::v1::locksmith_client::LocksmithClient<tonic::transport::Channel>,
    first: locksmith_proto::v1::client_message::Kind,
) -> (
    tokio::sync::mpsc::UnboundedSender<locksmith_proto::v1::ClientBatch>,
    Result<tonic::Streaming<locksmith_proto::v1::ServerBatch>, tonic::Status>,
) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tx.send(locksmith_proto::v1::ClientBatch {
        messages: vec![locksmith_proto::v1::ClientMessage { kind: Some(first) }],
        ..Default::default()
    })
    .unwrap();
    let outbound = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|message| (message, rx))
    });
    let stream = client.session(outbound).await.map(|r| r.into_inner());
    (tx, stream)
}

impl RawSession {
    /// Opens a session with the given TTL.
    pub async fn open(port: u16, ttl_ms: u64) -> RawSession {
        use locksmith_proto::v1 as pb;
        let open = pb::client_message::Kind::Open(pb::OpenSession {
            client_name: "raw".into(),
            host: "test".into(),
            ttl_ms,
        });
        let mut raw = RawSession::start(port, open).await;
        match raw.buffered.pop_front().and_then(|m| m.kind) {
            Some(pb::server_message::Kind::Opened(opened)) => {
                raw.session_id = opened.session_id;
                raw.secret = opened.secret;
            }
            other => panic!("expected opened, got {other:?}"),
        }
        raw
    }

    /// Resumes session `session_id` on a new stream.
    pub async fn resume(port: u16, session_id: u64, secret: Vec<u8>) -> RawSession {
        use locksmith_proto::v1 as pb;
        let resume = pb::client_message::Kind::Resume(pb::ResumeSession {
            session_id,
            secret: secret.clone(),
        });
        let mut raw = RawSession::start(port, resume).await;
        match raw.buffered.pop_front().and_then(|m| m.kind) {
            Some(pb::server_message::Kind::Resumed(resumed)) => {
                assert_eq!(resumed.session_id, session_id)
            }
            other => panic!("expected resumed, got {other:?}"),
        }
        raw.session_id = session_id;
        raw.secret = secret;
        raw
    }

    /// A stream whose first message is `first`, with the server's first
    /// batch read.
    async fn start(port: u16, first: locksmith_proto::v1::client_message::Kind) -> RawSession {
        let (tx, stream) = raw_stream(port, first).await;
        let mut inbound = stream.expect("session call");
        let buffered = inbound
            .message()
            .await
            .expect("first message")
            .map(|batch| batch.messages)
            .unwrap_or_default()
            .into();
        RawSession {
            tx,
            inbound,
            buffered,
            session_id: 0,
            secret: Vec::new(),
        }
    }

    /// Reads the stream to its end: how many messages came, and the status
    /// it ended with (`None` for a clean end).
    pub async fn drain(&mut self) -> (usize, Option<tonic::Status>) {
        let mut read = self.buffered.drain(..).count();
        loop {
            match self.inbound.message().await {
                Ok(Some(batch)) => read += batch.messages.len(),
                Ok(None) => return (read, None),
                Err(status) => return (read, Some(status)),
            }
        }
    }

    /// Sends one message (alone in its batch).
    pub fn send(&self, kind: locksmith_proto::v1::client_message::Kind) {
        self.send_batch(vec![kind]);
    }

    /// Sends several messages as one batch.
    pub fn send_batch(&self, kinds: Vec<locksmith_proto::v1::client_message::Kind>) {
        let messages = kinds
            .into_iter()
            .map(|kind| locksmith_proto::v1::ClientMessage { kind: Some(kind) })
            .collect();
        self.tx
            .send(locksmith_proto::v1::ClientBatch {
                messages,
                ..Default::default()
            })
            .expect("stream open");
    }

    /// Acknowledges final replies (an empty batch carrying only the acks).
    pub fn ack(&self, replies: Vec<u64>) {
        self.tx
            .send(locksmith_proto::v1::ClientBatch {
                ack_replies: replies,
                ..Default::default()
            })
            .expect("stream open");
    }

    /// Sends a request.
    pub fn request(&self, id: u64, op: locksmith_proto::v1::request::Op) {
        self.send(locksmith_proto::v1::client_message::Kind::Request(
            locksmith_proto::v1::Request { id, op: Some(op) },
        ));
    }

    /// The next message (`None` when the stream ends); panics after 15 s.
    pub async fn next(&mut self) -> Option<locksmith_proto::v1::server_message::Kind> {
        loop {
            if let Some(message) = self.buffered.pop_front() {
                return message.kind;
            }
            match tokio::time::timeout(Duration::from_secs(15), self.inbound.message()).await {
                Ok(Ok(Some(batch))) => self.buffered.extend(batch.messages),
                Ok(Ok(None)) => return None,
                Ok(Err(status)) => panic!("stream failed: {status}"),
                Err(_) => panic!("no message within 15 s"),
            }
        }
    }

    /// Reads one message: `Some(code)` if the stream failed with that status,
    /// `None` if a message (or the end) arrived.
    pub async fn next_status(&mut self) -> Option<tonic::Code> {
        if self.buffered.pop_front().is_some() {
            return None;
        }
        match self.inbound.message().await {
            Err(status) => Some(status.code()),
            Ok(Some(batch)) => {
                self.buffered.extend(batch.messages);
                None
            }
            Ok(None) => None,
        }
    }

    /// The final reply to request `id` (skipping other messages).
    pub async fn reply(&mut self, id: u64) -> locksmith_proto::v1::reply::Result {
        use locksmith_proto::v1 as pb;
        loop {
            match self.next().await {
                Some(pb::server_message::Kind::Reply(pb::Reply {
                    id: got,
                    result: Some(result),
                })) if got == id && !matches!(result, pb::reply::Result::Queued(_)) => {
                    return result
                }
                Some(_) => {}
                None => panic!("stream ended before the reply to {id}"),
            }
        }
    }

    /// Acquires `name` exclusively as owner "raw" and returns the final reply.
    pub async fn acquire(
        &mut self,
        id: u64,
        name: &str,
        wait: locksmith_proto::v1::WaitKind,
    ) -> locksmith_proto::v1::reply::Result {
        use locksmith_proto::v1 as pb;
        self.request(
            id,
            pb::request::Op::Acquire(pb::Acquire {
                names: vec![name.into()],
                owner: "raw".into(),
                wait: wait as i32,
                reentrant: true,
                ..Default::default()
            }),
        );
        self.reply(id).await
    }
}

/// Runs `locksmith serve` on `data_dir`, expecting it to exit with a failure
/// before it serves; returns what it printed. Panics if it serves instead.
pub fn refused_start(data_dir: &Path, extra: &[&str]) -> String {
    use std::io::Read;
    use std::sync::{Arc, Mutex};

    let mut child = std::process::Command::new(BINARY)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(data_dir)
        .args(extra)
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start locksmith serve");
    let printed = Arc::new(Mutex::new(String::new()));
    let reader = {
        let mut stderr = child.stderr.take().expect("piped");
        let printed = printed.clone();
        std::thread::spawn(move || {
            let mut chunk = [0; 4096];
            while let Ok(n @ 1..) = stderr.read(&mut chunk) {
                printed
                    .lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&chunk[..n]));
            }
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().expect("wait for locksmith serve") {
            reader.join().expect("stderr reader");
            let text = printed.lock().unwrap().clone();
            assert!(
                !status.success(),
                "locksmith serve exited with success:\n{text}"
            );
            return text;
        }
        let serving = printed
            .lock()
            .unwrap()
            .contains("locksmith server listening");
        if serving || std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "locksmith serve started on {} instead of refusing:\n{}",
                data_dir.display(),
                printed.lock().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `GET path` on 127.0.0.1:`port`: the status code and the body.
pub async fn get(port: u16, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect to the HTTP listener");
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    let (head, body) = response.split_once("\r\n\r\n").expect("HTTP response");
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .expect("status code");
    (code, body.to_owned())
}

/// `/metrics`, parsed as Prometheus text.
///
/// Cancel safety: safe; it only reads, on a connection of its own.
pub async fn scrape(port: u16) -> prometheus_parse::Scrape {
    let (code, body) = get(port, "/metrics").await;
    assert_eq!(code, 200, "{body}");
    let lines = body.lines().map(|line| Ok(line.to_owned()));
    prometheus_parse::Scrape::parse(lines).expect("Prometheus text format")
}

/// The value of the sample `name` with these labels (counters, gauges and
/// the `_count`/`_sum` of histograms).
pub fn value(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    use prometheus_parse::Value;
    let sample = scrape
        .samples
        .iter()
        .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .unwrap_or_else(|| panic!("no sample {name}{labels:?}"));
    match sample.value {
        Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
        ref other => panic!("{name} is not a single value: {other:?}"),
    }
}

/// The value of the sample `name` with these labels, scraped now.
///
/// Cancel safety: as [`scrape`].
pub async fn metric(port: u16, name: &str, labels: &[(&str, &str)]) -> f64 {
    value(&scrape(port).await, name, labels)
}
