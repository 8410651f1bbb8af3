//! Malformed input and limits against a real `locksmith serve` process: garbage
//! on the port, protocol misuse, invalid names, out-of-range TTLs, wrong
//! owners, oversized messages. Each gets a clear error, changes nothing, and
//! the server keeps serving everyone else.
//!
//! Needs the CLI binary, so it lives in locksmith-cli and not with the
//! server's own tests in locksmith-server: it starts `locksmith serve` as a
//! process, to test the server as an operator runs it (flags, data
//! directory, signals, restarts).

use crate::server_support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::OnceLock;
use std::time::Duration;

use locksmith::Error;
use locksmith_proto::v1 as pb;
use pb::client_message::Kind as Out;
use server_support::{grpc, raw_stream, unique, RawSession, ServerProcess};
use tonic::Code;

fn server() -> &'static ServerProcess {
    static SERVER: OnceLock<ServerProcess> = OnceLock::new();
    let server = SERVER.get_or_init(ServerProcess::start);
    server.assert_running();
    server
}

/// Writes `bytes` on a fresh connection and reads until the server closes it.
fn send_garbage(port: u16, bytes: &[u8]) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let _ = stream.write_all(bytes);
    let mut sink = Vec::new();
    // The server answers with a GOAWAY (or nothing) and closes: read to EOF.
    let result = stream.read_to_end(&mut sink);
    assert!(
        !matches!(&result, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut),
        "the server kept a garbage connection open"
    );
}

/// Pseudo-random bytes (xorshift), reproducible.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_the_port_closes_only_that_connection() {
    let server = server();
    let client = server.client(Duration::from_secs(5)).await;
    let name = unique("garbage");
    let guard = client.lock(name.as_str()).acquire().await.unwrap();

    let port = server.port();
    tokio::task::spawn_blocking(move || {
        for seed in 0..16 {
            send_garbage(port, &noise(seed, 64 + 997 * seed as usize));
        }
        send_garbage(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        // A valid HTTP/2 preface, then a frame header announcing 16 MiB of junk.
        let mut preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        preface.extend_from_slice(&[0xff, 0xff, 0xff, 0x00, 0x00, 0, 0, 0, 1]);
        preface.extend_from_slice(&noise(99, 4096));
        send_garbage(port, &preface);
    })
    .await
    .unwrap();

    server.assert_running();
    assert!(!guard.is_lost(), "{:?}", guard.lost_signal().reason());
    let other = server.client(Duration::from_secs(5)).await;
    assert!(other
        .lock(name.as_str())
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    guard
        .release()
        .await
        .expect("the session lived through the garbage");
    let again = other.lock(name.as_str()).try_acquire().await.unwrap();
    assert!(again.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_names_get_clear_errors_everywhere() {
    let server = server();
    let mut grpc = grpc(server.port()).await;
    let long = "x".repeat(513);
    for bad in ["", "/a", "a/", "a//b", "nul\0byte", long.as_str()] {
        let status = grpc
            .acquire_lease(pb::AcquireLeaseRequest {
                acquire: Some(pb::Acquire {
                    names: vec![bad.into()],
                    owner: "o".into(),
                    lease_ms: Some(1000),
                    ..Default::default()
                }),
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{bad:?}: {status}");
        assert!(status.message().contains("invalid lock name"), "{status}");
        let status = grpc
            .describe(pb::DescribeRequest { name: bad.into() })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        let status = grpc
            .force_release(pb::ForceReleaseRequest { name: bad.into() })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
    }
    // On a session stream: a reply with the code and the broken rule.
    let mut session = RawSession::open(server.port(), 5_000).await;
    match session.acquire(1, "a//b", pb::WaitKind::No).await {
        pb::reply::Result::Error(e) => {
            assert_eq!(e.code, pb::ErrorCode::InvalidName as i32);
            assert_eq!(e.name_error, pb::NameErrorKind::EmptySegment as i32);
        }
        other => panic!("{other:?}"),
    }
    match session.acquire(2, &long, pb::WaitKind::No).await {
        pb::reply::Result::Error(e) => {
            assert_eq!(e.name_error, pb::NameErrorKind::TooLong as i32);
            assert_eq!(e.name_len, 513);
        }
        other => panic!("{other:?}"),
    }
    // The session is fine after that.
    let good = unique("after-bad-names");
    assert!(matches!(
        session.acquire(3, &good, pb::WaitKind::No).await,
        pb::reply::Result::Granted(_)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_lease_and_delay_bounds() {
    let server = server();
    for ttl in [0, 5, u64::MAX] {
        let open = Out::Open(pb::OpenSession {
            client_name: "bounds".into(),
            host: "test".into(),
            ttl_ms: ttl,
        });
        let (_tx, stream) = raw_stream(server.port(), open).await;
        let status = stream.unwrap().message().await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "ttl {ttl}: {status}");
        assert!(status.message().contains("session TTL"), "{status}");
    }
    let mut grpc = grpc(server.port()).await;
    let name = unique("bounds");
    let lease = |lease_ms: Option<u64>, lock_delay_ms: u64| pb::AcquireLeaseRequest {
        acquire: Some(pb::Acquire {
            names: vec![name.clone()],
            owner: "o".into(),
            lease_ms,
            lock_delay_ms,
            ..Default::default()
        }),
    };
    for (request, needle) in [
        (lease(None, 0), "lease_ms is required"),
        (lease(Some(0), 0), "lease"),
        (lease(Some(u64::MAX), 0), "lease"),
        (lease(Some(1000), 61_000), "lock-delay"),
    ] {
        let status = grpc.acquire_lease(request).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status}");
        assert!(status.message().contains(needle), "{status}");
    }
    let none = grpc
        .describe(pb::DescribeRequest { name: name.clone() })
        .await
        .unwrap()
        .into_inner();
    assert!(none.lock.is_none(), "a refused acquire changed something");
    // The library refuses them before any I/O, with the same kind of error.
    let client = server.client(Duration::from_secs(5)).await;
    assert!(matches!(
        client
            .lock(name.as_str())
            .lease(Duration::ZERO)
            .try_acquire()
            .await,
        Err(Error::InvalidArgument(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_by_a_wrong_owner_is_refused_and_changes_nothing() {
    let server = server();
    let mut grpc = grpc(server.port()).await;
    let name = unique("owner");
    let granted = grpc
        .acquire_lease(pb::AcquireLeaseRequest {
            acquire: Some(pb::Acquire {
                names: vec![name.clone()],
                owner: "alice".into(),
                lease_ms: Some(30_000),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(granted.granted);
    let token = granted.tokens[0];
    let release = |owner: &str, token: Option<u64>| pb::ReleaseRequest {
        release: Some(pb::Release {
            name: name.clone(),
            owner: owner.into(),
            token,
        }),
    };
    let status = grpc.release(release("mallory", None)).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status}");
    assert!(
        status.message().contains("held by another owner"),
        "{status}"
    );
    let status = grpc
        .release(release("alice", Some(token + 1)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status}");
    let status = grpc.release(release("", None)).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");
    let info = grpc
        .describe(pb::DescribeRequest { name: name.clone() })
        .await
        .unwrap()
        .into_inner()
        .lock
        .expect("still held");
    assert_eq!(info.holders[0].owner, "alice");
    assert_eq!(info.holders[0].fencing_token, token);

    // A session stream gets the same answer as a reply code.
    let mut session = RawSession::open(server.port(), 5_000).await;
    session.request(
        1,
        pb::request::Op::Release(pb::Release {
            name: name.clone(),
            owner: "mallory".into(),
            token: None,
        }),
    );
    match session.reply(1).await {
        pb::reply::Result::Error(e) => assert_eq!(e.code, pb::ErrorCode::NotOwner as i32),
        other => panic!("{other:?}"),
    }

    grpc.release(release("alice", Some(token))).await.unwrap();
    let status = grpc
        .release(release("alice", Some(token)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "released twice: {status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_misuse_ends_only_that_stream() {
    let server = server();
    let port = server.port();

    // The first message must open or resume.
    let (_tx, stream) = raw_stream(port, Out::Heartbeat(pb::Heartbeat {})).await;
    let status = stream.unwrap().message().await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status}");

    // Resume with a wrong secret, or a secret of the wrong size.
    let session = RawSession::open(port, 5_000).await;
    for (secret, code) in [
        (vec![0u8; 16], Code::NotFound),
        (vec![1, 2, 3], Code::InvalidArgument),
    ] {
        let resume = Out::Resume(pb::ResumeSession {
            session_id: session.session_id,
            secret,
        });
        let (_tx, stream) = raw_stream(port, resume).await;
        let status = stream.unwrap().message().await.unwrap_err();
        assert_eq!(status.code(), code, "{status}");
    }

    // Malformed requests get an error reply and the stream goes on.
    let mut session = session;
    let name = unique("misuse");
    let acquire = |f: &dyn Fn(&mut pb::Acquire)| {
        let mut a = pb::Acquire {
            names: vec![name.clone()],
            owner: "o".into(),
            ..Default::default()
        };
        f(&mut a);
        pb::request::Op::Acquire(a)
    };
    let cases: Vec<(pb::request::Op, pb::ErrorCode)> = vec![
        (acquire(&|a| a.mode = 7), pb::ErrorCode::InvalidArgument),
        (acquire(&|a| a.wait = 9), pb::ErrorCode::InvalidArgument),
        (
            acquire(&|a| a.owner = String::new()),
            pb::ErrorCode::InvalidArgument,
        ),
        (
            acquire(&|a| a.owner = "o".repeat(300)),
            pb::ErrorCode::InvalidArgument,
        ),
        (
            acquire(&|a| {
                a.mode = pb::LockMode::Semaphore as i32;
                a.permits = 0;
            }),
            pb::ErrorCode::InvalidArgument,
        ),
        (
            acquire(&|a| a.names = (0..65).map(|i| format!("{name}/{i}")).collect()),
            pb::ErrorCode::LimitReached,
        ),
        (
            acquire(&|a| a.names = vec![name.clone(), name.clone()]),
            pb::ErrorCode::InvalidArgument,
        ),
    ];
    for (id, (op, code)) in cases.into_iter().enumerate() {
        let id = id as u64 + 1;
        session.request(id, op);
        match session.reply(id).await {
            pb::reply::Result::Error(e) => assert_eq!(e.code, code as i32, "request {id}: {e:?}"),
            other => panic!("request {id}: {other:?}"),
        }
    }
    session.send(Out::Request(pb::Request { id: 50, op: None }));
    match session.reply(50).await {
        pb::reply::Result::Error(e) => assert_eq!(e.code, pb::ErrorCode::InvalidArgument as i32),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        session.acquire(51, &name, pb::WaitKind::No).await,
        pb::reply::Result::Granted(_)
    ));

    // A second open on the same stream ends it (one session per stream).
    session.send(Out::Open(pb::OpenSession {
        client_name: "again".into(),
        host: "test".into(),
        ttl_ms: 1000,
    }));
    let mut ended = None;
    for _ in 0..20 {
        match tokio::time::timeout(Duration::from_secs(10), session.next_status()).await {
            Ok(Some(code)) => {
                ended = Some(code);
                break;
            }
            Ok(None) => {}
            Err(_) => break,
        }
    }
    assert_eq!(
        ended,
        Some(Code::FailedPrecondition),
        "the stream was not ended"
    );

    // Everyone else is fine.
    let client = server.client(Duration::from_secs(5)).await;
    assert!(client
        .lock(unique("fine"))
        .try_acquire()
        .await
        .unwrap()
        .is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_messages_are_refused() {
    let server = server();
    let mut grpc = grpc(server.port()).await;
    let status = grpc
        .acquire_lease(pb::AcquireLeaseRequest {
            acquire: Some(pb::Acquire {
                names: vec![unique("big")],
                owner: "o".repeat(2 << 20),
                lease_ms: Some(1000),
                ..Default::default()
            }),
        })
        .await
        .unwrap_err();
    assert!(
        matches!(status.code(), Code::OutOfRange | Code::ResourceExhausted),
        "{status}"
    );
    // The connection and the server are fine.
    let listed = grpc
        .list(pb::ListRequest {
            prefix: "nothing-here/".into(),
            ..Default::default()
        })
        .await;
    assert!(listed.is_ok(), "{listed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_have_their_own_errors() {
    let server = ServerProcess::start_with(&[
        "--max-sessions",
        "3",
        "--max-waiters-per-lock",
        "1",
        "--max-holds-per-session",
        "2",
        "--max-sessions-per-connection",
        "1",
    ]);
    let ttl = Duration::from_secs(5);
    let (a, b, c) = (
        server.client(ttl).await,
        server.client(ttl).await,
        server.client(ttl).await,
    );
    match locksmith::Client::connect(&server.url()).await {
        Err(Error::LimitReached(message)) => assert!(message.contains("sessions"), "{message}"),
        other => panic!("a fourth session: {other:?}"),
    }
    let name = unique("limits");
    let held = a.lock(format!("{name}/x")).acquire().await.unwrap();
    let _second = a.lock(format!("{name}/y")).acquire().await.unwrap();
    match a.lock(format!("{name}/z")).try_acquire().await {
        Err(Error::LimitReached(message)) => {
            assert!(message.contains("holds per session"), "{message}")
        }
        other => panic!("a third hold: {other:?}"),
    }
    let waiting = tokio::spawn({
        let lock = b.lock(format!("{name}/x"));
        async move { lock.acquire().await }
    });
    let x = format!("{name}/x");
    server_support::eventually(Duration::from_secs(10), "one waiter", || async {
        a.describe(&x)
            .await
            .unwrap()
            .is_some_and(|i| i.waiters.len() == 1)
    })
    .await;
    match c
        .lock(format!("{name}/x"))
        .acquire_timeout(Duration::from_secs(5))
        .await
    {
        Err(Error::LimitReached(message)) => {
            assert!(message.contains("waiters per lock"), "{message}")
        }
        other => panic!("a second waiter: {other:?}"),
    }
    held.release().await.unwrap();
    waiting.await.unwrap().unwrap().release().await.unwrap();

    // A second session on one connection is refused (each library client has
    // its own connection, so they are not affected). The session limit of 3 is
    // reached, so close one first.
    c.close().await.unwrap();
    let mut connection = grpc(server.port()).await;
    let open = || {
        Out::Open(pb::OpenSession {
            client_name: "multi".into(),
            host: "test".into(),
            ttl_ms: 5_000,
        })
    };
    let (_first_tx, first) = server_support::raw_stream_on(&mut connection, open()).await;
    let mut first = first.unwrap();
    assert!(matches!(
        first.message().await.unwrap().unwrap().messages[0].kind,
        Some(pb::server_message::Kind::Opened(_))
    ));
    let (_tx, second) = server_support::raw_stream_on(&mut connection, open()).await;
    let status = match second {
        Err(status) => status,
        Ok(mut stream) => stream.message().await.unwrap_err(),
    };
    assert_eq!(status.code(), Code::ResourceExhausted, "{status}");
    assert!(
        status.message().contains("sessions per connection"),
        "{status}"
    );
}
