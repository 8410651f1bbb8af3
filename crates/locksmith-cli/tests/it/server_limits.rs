//! The server's limits against a real `locksmith serve` process, each hit the
//! way a careless or hostile client would: connections that never finish the
//! HTTP/2 handshake, more connections than allowed, running out of file
//! descriptors. Each gets a clear refusal and a log line, and the
//! well-behaved client keeps being served.
//!
//! Needs the CLI binary, so it lives in locksmith-cli and not with the
//! server's own tests in locksmith-server: it starts `locksmith serve` as a
//! process, to test the server as an operator runs it (flags, data
//! directory, signals, restarts).

use crate::server_support;

use std::io::Read;
use std::net::TcpStream;
use std::time::Duration;

use locksmith_proto::v1 as pb;
use server_support::{eventually, unique, RawSession, ServerProcess};

/// Whether the server closes `stream` (EOF or reset) before `guard` passes:
/// the guard only keeps a broken server from hanging the test.
fn closed_by_server(mut stream: TcpStream, guard: Duration) -> bool {
    stream.set_read_timeout(Some(guard)).unwrap();
    let mut sink = Vec::new();
    match stream.read_to_end(&mut sink) {
        Ok(_) => true,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

fn connect(port: u16) -> TcpStream {
    TcpStream::connect(("127.0.0.1", port)).expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_without_a_handshake_is_closed() {
    let server = ServerProcess::start_with(&["--handshake-timeout", "500ms"]);
    let client = server.client(Duration::from_secs(5)).await;
    let name = unique("handshake");
    let guard = client.lock(name.as_str()).acquire().await.unwrap();

    let port = server.port();
    let (silent, half) = tokio::task::spawn_blocking(move || {
        let silent = connect(port);
        // Half of the preface, then nothing.
        let mut half = connect(port);
        std::io::Write::write_all(&mut half, b"PRI * HTTP/2.0\r\n").unwrap();
        let guard = Duration::from_secs(30);
        (
            closed_by_server(silent, guard),
            closed_by_server(half, guard),
        )
    })
    .await
    .unwrap();
    assert!(silent, "a connection that sent nothing stayed open");
    assert!(half, "a connection that sent half a preface stayed open");

    server.assert_running();
    assert!(!guard.is_lost());
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_limit_are_closed_at_once() {
    let server =
        ServerProcess::start_with(&["--max-connections", "3", "--handshake-timeout", "60s"]);
    let client = server.client(Duration::from_secs(5)).await;
    let name = unique("connection-limit");
    let guard = client.lock(name.as_str()).acquire().await.unwrap();

    let port = server.port();
    // Two idle connections take the other places.
    let idle: Vec<TcpStream> = (0..2).map(|_| connect(port)).collect();
    let refused = tokio::task::spawn_blocking(move || {
        closed_by_server(connect(port), Duration::from_secs(30))
    })
    .await
    .unwrap();
    assert!(refused, "a connection past the limit stayed open");
    eventually(
        Duration::from_secs(10),
        "a warning about the limit",
        || async { server.log_tail(50).contains("limit reached: connections") },
    )
    .await;

    // The connection inside the limit is served as before.
    guard.release().await.unwrap();
    let guard = client.lock(name.as_str()).acquire().await.unwrap();
    // A place that frees up can be used again.
    drop(idle);
    let other = server.client(Duration::from_secs(5)).await;
    assert!(other
        .lock(name.as_str())
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    guard.release().await.unwrap();
    assert!(other
        .lock(name.as_str())
        .try_acquire()
        .await
        .unwrap()
        .is_some());
}

/// User plus system CPU time of a process so far, from `/proc/<pid>/stat`.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which is in parentheses): utime and
    // stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf only reads a configuration value.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_millis(ticks * 1000 / per_second)
}

/// Sets the soft open-file limit of process `pid`; returns the old one.
fn set_open_file_limit(pid: u32, limit: u64) -> u64 {
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: prlimit reads and writes only the structs passed.
    let rc = unsafe {
        libc::prlimit(
            pid as libc::pid_t,
            libc::RLIMIT_NOFILE,
            std::ptr::null(),
            &mut old,
        )
    };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
    let new = libc::rlimit {
        rlim_cur: limit,
        rlim_max: old.rlim_max,
    };
    // SAFETY: as above.
    let rc = unsafe {
        libc::prlimit(
            pid as libc::pid_t,
            libc::RLIMIT_NOFILE,
            &new,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
    old.rlim_cur
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_file_descriptors_the_accept_loop_backs_off_and_says_so() {
    let server = ServerProcess::start();
    let pid = server.pid();
    let client = server.client(Duration::from_secs(5)).await;
    let name = unique("emfile");
    let guard = client.lock(name.as_str()).acquire().await.unwrap();

    let open_files = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count() as u64;
    let old_limit = set_open_file_limit(pid, open_files + 4);
    let port = server.port();
    // More connections than descriptors left: the rest wait in the backlog
    // while every accept fails with EMFILE.
    let waiting: Vec<TcpStream> = (0..16).map(|_| connect(port)).collect();
    eventually(
        Duration::from_secs(10),
        "a log line about accept failing",
        || async { server.log_tail(50).contains("cannot accept connections") },
    )
    .await;
    // While it lasts, the loop waits instead of spinning: a spinning loop
    // burns every bit of CPU it gets.
    let before = cpu_time(pid);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let used = cpu_time(pid) - before;
    assert!(
        used < Duration::from_millis(300),
        "the server used {used:?} of CPU in one second while out of file descriptors"
    );

    // The well-behaved client is still served, and once descriptors are free
    // again the server takes new connections and says so.
    guard.release().await.unwrap();
    drop(waiting);
    set_open_file_limit(pid, old_limit);
    let other = server.client(Duration::from_secs(5)).await;
    assert!(other
        .lock(name.as_str())
        .try_acquire()
        .await
        .unwrap()
        .is_some());
    eventually(
        Duration::from_secs(10),
        "a log line about recovering",
        || async { server.log_tail(50).contains("accepting connections again") },
    )
    .await;
    server.assert_running();
}

/// Opens a session from `local` (a loopback address other than 127.0.0.1
/// makes a second client address) and returns the first server message or
/// the refusal; the stream stays open while the returned sender lives.
async fn open_from(
    port: u16,
    local: std::net::IpAddr,
    ttl_ms: u64,
) -> (
    tokio::sync::mpsc::UnboundedSender<pb::ClientBatch>,
    Result<pb::server_message::Kind, tonic::Status>,
) {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .local_address(Some(local))
        .connect()
        .await
        .expect("connect");
    let mut client = pb::locksmith_client::LocksmithClient::new(channel);
    let open = pb::client_message::Kind::Open(pb::OpenSession {
        client_name: "abandoner".into(),
        host: "test".into(),
        ttl_ms,
    });
    let (tx, stream) = server_support::raw_stream_on(&mut client, open).await;
    let first = match stream {
        Err(status) => Err(status),
        Ok(mut inbound) => match inbound.message().await {
            Err(status) => Err(status),
            Ok(Some(mut batch)) => Ok(batch.messages.remove(0).kind.expect("a message")),
            Ok(None) => panic!("the stream ended without a word"),
        },
    };
    (tx, first)
}

const OTHER_ADDRESS: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));
const LOOPBACK: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_ttl_a_client_may_ask_for_is_capped() {
    let server = ServerProcess::start_with(&["--max-session-ttl", "60s"]);
    for (ttl, allowed) in [(24 * 3_600_000, false), (60_001, false), (60_000, true)] {
        let (_tx, first) = open_from(server.port(), LOOPBACK, ttl).await;
        match first {
            Ok(pb::server_message::Kind::Opened(opened)) if allowed => {
                assert_eq!(opened.ttl_ms, ttl)
            }
            Err(status) if !allowed => {
                assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}");
                assert!(status.message().contains("session TTL"), "{status}");
                assert!(status.message().contains("60000"), "{status}");
            }
            other => panic!("TTL {ttl} ms: {other:?}"),
        }
    }
    // The default cap is 5 minutes.
    let server = ServerProcess::start();
    let (_tx, first) = open_from(server.port(), LOOPBACK, 24 * 3_600_000).await;
    assert_eq!(first.unwrap_err().code(), tonic::Code::InvalidArgument);
    let (_tx, first) = open_from(server.port(), LOOPBACK, 300_000).await;
    assert!(matches!(first, Ok(pb::server_message::Kind::Opened(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_address_cannot_take_every_session() {
    let server =
        ServerProcess::start_with(&["--max-sessions", "8", "--max-sessions-per-peer", "4"]);
    // One client opens sessions on new connections and abandons them.
    for _ in 0..4 {
        let (tx, first) = open_from(server.port(), OTHER_ADDRESS, 60_000).await;
        assert!(
            matches!(first, Ok(pb::server_message::Kind::Opened(_))),
            "{first:?}"
        );
        drop(tx);
    }
    let (_tx, first) = open_from(server.port(), OTHER_ADDRESS, 60_000).await;
    let status = first.expect_err("a fifth session from the same address");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status}");
    assert!(status.message().contains("one client address"), "{status}");
    // Everyone else is still served.
    let client = server.client(Duration::from_secs(5)).await;
    let name = unique("per-peer");
    let guard = client.lock(name.as_str()).acquire().await.unwrap();
    guard.release().await.unwrap();
}

/// Runs `locksmith session ...` against `server`; returns (success, stdout,
/// stderr).
async fn session_command(server: &ServerProcess, args: &[&str]) -> (bool, String, String) {
    let output = tokio::process::Command::new(server_support::BINARY)
        .arg("session")
        .args(args)
        .args(["--backend", &server.url()])
        .output()
        .await
        .unwrap();
    (
        output.status.success(),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

/// The id (as listed) of the session whose row contains `needle`.
fn listed_id(list: &str, needle: &str) -> String {
    list.lines()
        .find(|line| line.contains(needle))
        .unwrap_or_else(|| panic!("no session with {needle} in\n{list}"))
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_administrator_lists_and_ends_sessions() {
    let server = ServerProcess::start();
    let options = locksmith::ConnectOptions::default()
        .session_ttl(Duration::from_secs(5))
        .client_name("well-behaved");
    let client = locksmith::Client::connect_with(&server.url(), options)
        .await
        .unwrap();
    let kept = unique("admin-kept");
    let guard = client.lock(kept.as_str()).acquire().await.unwrap();

    // A client takes a lock and abandons its session (60 s TTL).
    let mut abandoned = RawSession::open(server.port(), 60_000).await;
    let taken = unique("admin-taken");
    assert!(matches!(
        abandoned.acquire(1, &taken, pb::WaitKind::No).await,
        pb::reply::Result::Granted(_)
    ));
    drop(abandoned);

    eventually(
        Duration::from_secs(10),
        "the abandoned session shows disconnected",
        || async {
            let (ok, list, _) = session_command(&server, &["list"]).await;
            ok && list
                .lines()
                .any(|l| l.contains("raw") && l.contains(" no "))
        },
    )
    .await;
    let (ok, text, stderr) = session_command(&server, &["list"]).await;
    assert!(ok, "{stderr}");
    assert!(text.contains("127.0.0.1:"), "no client address in\n{text}");
    let id = listed_id(&text, "raw");
    let (ok, _, stderr) = session_command(&server, &["end", &id]).await;
    assert!(ok, "{stderr}");
    assert!(stderr.contains("ended session"), "{stderr}");

    // Its lock is free at once; the other session is untouched.
    let other = client.lock(taken.as_str()).try_acquire().await.unwrap();
    assert!(other.is_some(), "the ended session's lock is still held");
    assert!(!guard.is_lost());

    // Ending an attached session tells its client.
    let id = listed_id(&session_command(&server, &["list"]).await.1, "well-behaved");
    let (ok, _, stderr) = session_command(&server, &["end", &id]).await;
    assert!(ok, "{stderr}");
    let reason = tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the holder was told");
    assert!(!reason.is_empty());

    // An unknown id is an error.
    let (ok, _, stderr) = session_command(&server, &["end", "ffffffffffffff"]).await;
    assert!(!ok);
    assert!(stderr.contains("unknown session"), "{stderr}");
}
