//! Answers the server must get right whatever a client sends, against a real
//! `locksmith serve` process: lock names checked the same way by every call,
//! strings that are not UTF-8, reused request ids, unary acquires whose
//! caller gives up, and `locksmith status` output that a lock name cannot
//! forge.
//!
//! Needs the CLI binary, so it lives in locksmith-cli and not with the
//! server's own tests in locksmith-server: it starts `locksmith serve` as a
//! process, to test the server as an operator runs it (flags, data
//! directory, signals, restarts).

use crate::server_support;

use std::sync::OnceLock;

use locksmith_proto::prost::bytes::{Buf, BufMut};
use locksmith_proto::prost::encoding::{skip_field, DecodeContext, WireType};
use locksmith_proto::prost::{DecodeError, Message};
use locksmith_proto::v1 as pb;
use locksmith_proto::ProtoCodec;
use server_support::{grpc, RawSession, ServerProcess};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::Code;

fn server() -> &'static ServerProcess {
    static SERVER: OnceLock<ServerProcess> = OnceLock::new();
    let server = SERVER.get_or_init(ServerProcess::start);
    server.assert_running();
    server
}

/// An already encoded message, sent as is: how a hostile client puts bytes
/// the generated types cannot express on the wire.
#[derive(Debug, Default)]
struct Raw(Vec<u8>);

impl Message for Raw {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        buf.put_slice(&self.0);
    }
    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        skip_field(wire_type, tag, buf, ctx)
    }
    fn encoded_len(&self) -> usize {
        self.0.len()
    }
    fn clear(&mut self) {
        self.0.clear();
    }
}

/// `message` encoded, with the string `marker` in it overwritten by bytes that
/// are not UTF-8.
fn not_utf8(message: &impl Message, marker: &str) -> Raw {
    let mut bytes = message.encode_to_vec();
    let at = bytes
        .windows(marker.len())
        .position(|w| w == marker.as_bytes())
        .expect("marker in the encoding");
    bytes[at..at + marker.len()].fill(0xff);
    Raw(bytes)
}

/// A gRPC client that sends [`Raw`] messages.
async fn raw_client(port: u16) -> tonic::client::Grpc<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await
        .expect("connect");
    tonic::client::Grpc::new(channel)
}

fn release(name: &str) -> pb::request::Op {
    pb::request::Op::Release(pb::Release {
        name: name.into(),
        owner: "raw".into(),
        token: None,
    })
}

fn renew(name: &str) -> pb::request::Op {
    pb::request::Op::Renew(pb::Renew {
        name: name.into(),
        owner: "raw".into(),
        token: None,
        lease_ms: 1000,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_and_renew_check_names_like_acquire() {
    let server = server();
    let huge = "x".repeat(100_000);
    let mut grpc = grpc(server.port()).await;
    for bad in ["", "/a", "a//b", "nul\0byte", huge.as_str()] {
        let status = grpc
            .release(pb::ReleaseRequest {
                release: Some(pb::Release {
                    name: bad.into(),
                    owner: "o".into(),
                    token: None,
                }),
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status}");
        assert!(
            status.message().starts_with("invalid lock name"),
            "{status}"
        );
        assert!(status.message().len() < 300, "the name was echoed back");
        let status = grpc
            .renew(pb::RenewRequest {
                renew: Some(pb::Renew {
                    name: bad.into(),
                    owner: "o".into(),
                    token: None,
                    lease_ms: 1000,
                }),
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status}");
        assert!(status.message().len() < 300, "the name was echoed back");
    }

    // On a session stream: the reply an acquire gets for the same name.
    let mut session = RawSession::open(server.port(), 5_000).await;
    let mut id = 0;
    for (op, kind, len) in [
        (release(""), pb::NameErrorKind::Empty, 0),
        (renew(""), pb::NameErrorKind::Empty, 0),
        (release("a//b"), pb::NameErrorKind::EmptySegment, 0),
        (renew(&huge), pb::NameErrorKind::TooLong, huge.len()),
        (release(&huge), pb::NameErrorKind::TooLong, huge.len()),
    ] {
        id += 1;
        session.request(id, op);
        match session.reply(id).await {
            pb::reply::Result::Error(e) => {
                assert_eq!(e.code, pb::ErrorCode::InvalidName as i32, "{e:?}");
                assert_eq!(e.name_error, kind as i32);
                assert_eq!(e.name_len, len as u64);
                assert!(e.name.len() <= 64 && e.message.len() < 300, "echoed");
            }
            other => panic!("{other:?}"),
        }
    }
    // The stream and the session are fine after that.
    let name = server_support::unique("names-after");
    assert!(matches!(
        session.acquire(100, &name, pb::WaitKind::No).await,
        pb::reply::Result::Granted(_)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strings_that_are_not_utf8_are_invalid_arguments() {
    let server = server();
    let mut client = raw_client(server.port()).await;
    let calls = [
        (
            "/locksmith.v1.Locksmith/Describe",
            not_utf8(
                &pb::DescribeRequest {
                    name: "MARK".into(),
                },
                "MARK",
            ),
        ),
        (
            "/locksmith.v1.Locksmith/Release",
            not_utf8(
                &pb::ReleaseRequest {
                    release: Some(pb::Release {
                        name: "lock".into(),
                        owner: "MARK".into(),
                        token: None,
                    }),
                },
                "MARK",
            ),
        ),
    ];
    for (path, message) in calls {
        client.ready().await.unwrap();
        let status = client
            .unary::<Raw, pb::ReleaseResponse, _>(
                tonic::Request::new(message),
                PathAndQuery::from_static(path),
                ProtoCodec::default(),
            )
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{path}: {status}");
    }

    // On a session stream: a batch that does not decode ends the stream with
    // the same code (a retry would fail the same way).
    let open = pb::ClientBatch {
        messages: vec![pb::ClientMessage {
            kind: Some(pb::client_message::Kind::Open(pb::OpenSession {
                client_name: "raw".into(),
                host: "test".into(),
                ttl_ms: 5_000,
            })),
        }],
        ..Default::default()
    };
    let garbled = pb::ClientBatch {
        messages: vec![pb::ClientMessage {
            kind: Some(pb::client_message::Kind::Request(pb::Request {
                id: 1,
                op: Some(release("MARK")),
            })),
        }],
        ..Default::default()
    };
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tx.send(Raw(open.encode_to_vec())).unwrap();
    let outbound = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|message| (message, rx))
    });
    client.ready().await.unwrap();
    let mut inbound = client
        .streaming::<_, Raw, pb::ServerBatch, _>(
            tonic::Request::new(outbound),
            PathAndQuery::from_static("/locksmith.v1.Locksmith/Session"),
            ProtoCodec::default(),
        )
        .await
        .expect("session call")
        .into_inner();
    let opened = inbound.message().await.unwrap().unwrap();
    assert!(matches!(
        opened.messages[0].kind,
        Some(pb::server_message::Kind::Opened(_))
    ));
    tx.send(not_utf8(&garbled, "MARK")).unwrap();
    let status = loop {
        match inbound.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the stream ended without a status"),
            Err(status) => break status,
        }
    };
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");
    server.assert_running();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_escapes_what_is_not_printable() {
    let server = server();
    let prefix = server_support::unique("status-escapes");
    let name = format!("{prefix}/a\u{1b}[2J\u{1b}[H\nforged | row\r\u{202e}");
    let options = locksmith::ConnectOptions::default()
        .session_ttl(std::time::Duration::from_secs(5))
        .client_name("client\u{1b}]0;title\u{7}");
    let client = locksmith::Client::connect_with(&server.url(), options)
        .await
        .unwrap();
    let _guard = client
        .lock(name.as_str())
        .owner("owner\nwith a line break")
        .acquire()
        .await
        .unwrap();

    let output = tokio::process::Command::new(server_support::BINARY)
        .args(["status", &prefix, "--backend", &server.url()])
        .output()
        .await
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(
        !text
            .chars()
            .any(|c| c != '\n' && (c.is_control() || c == '\u{202e}')),
        "raw control characters reached the terminal:\n{text:?}"
    );
    // Header, separator, one row: the line breaks in the name and owner did
    // not make rows of their own.
    assert_eq!(text.trim_end().lines().count(), 3, "{text}");
    for shown in [
        "a\\u{1b}[2J\\u{1b}[H\\nforged | row\\r\\u{202e}",
        "owner\\nwith a line break",
        "client\\u{1b}]0;title\\u{7}@",
    ] {
        assert!(text.contains(shown), "{shown} missing from\n{text}");
    }
}

fn acquire_op(name: &str) -> pb::request::Op {
    pb::request::Op::Acquire(pb::Acquire {
        names: vec![name.into()],
        owner: "raw".into(),
        reentrant: true,
        ..Default::default()
    })
}

/// Who holds `name` (session ids), from `Describe`.
async fn holders(port: u16, name: &str) -> Vec<u64> {
    grpc(port)
        .await
        .describe(pb::DescribeRequest { name: name.into() })
        .await
        .unwrap()
        .into_inner()
        .lock
        .map(|l| l.holders.iter().map(|h| h.session_id).collect())
        .unwrap_or_default()
}

fn reused_id_error(result: pb::reply::Result) {
    match result {
        pb::reply::Result::Error(e) => {
            assert_eq!(e.code, pb::ErrorCode::InvalidArgument as i32, "{e:?}");
            assert!(e.message.contains("in use by another request"), "{e:?}");
        }
        other => panic!("a reused id was answered {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_request_id_is_a_protocol_error_and_a_retry_is_not() {
    let server = server();
    let port = server.port();
    let mut session = RawSession::open(port, 10_000).await;
    let (a, b, c) = (
        server_support::unique("reuse-a"),
        server_support::unique("reuse-b"),
        server_support::unique("reuse-c"),
    );

    // acquire id 7, then a release under id 7: refused, the release never
    // runs (it used to be answered "granted").
    session.request(7, acquire_op(&a));
    let token = match session.reply(7).await {
        pb::reply::Result::Granted(g) => g.tokens[0],
        other => panic!("{other:?}"),
    };
    session.request(7, release(&a));
    reused_id_error(session.reply(7).await);
    assert_eq!(holders(port, &a).await, [session.session_id]);

    // Two acquires with id 1 on different locks: the second is refused and
    // does not get the first one's token.
    session.request(1, acquire_op(&b));
    assert!(matches!(
        session.reply(1).await,
        pb::reply::Result::Granted(_)
    ));
    session.request(1, acquire_op(&c));
    reused_id_error(session.reply(1).await);
    assert!(holders(port, &c).await.is_empty());

    // The same request sent again gets its kept reply (the same token), and
    // runs once: the hold count stays 1.
    session.request(7, acquire_op(&a));
    match session.reply(7).await {
        pb::reply::Result::Granted(g) => assert_eq!(g.tokens, [token]),
        other => panic!("{other:?}"),
    }
    let described = grpc(port)
        .await
        .describe(pb::DescribeRequest { name: a.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(described.lock.unwrap().holders[0].hold_count, 1);

    // Once its reply is acknowledged, an id may carry a new request.
    session.ack(vec![7]);
    session.request(7, release(&a));
    assert!(matches!(session.reply(7).await, pb::reply::Result::Done(_)));
    assert!(holders(port, &a).await.is_empty());

    // A refused request keeps nothing: its id is free at once.
    session.request(30, release(&c));
    assert!(matches!(
        session.reply(30).await,
        pb::reply::Result::Error(_)
    ));
    session.request(30, acquire_op(&c));
    assert!(matches!(
        session.reply(30).await,
        pb::reply::Result::Granted(_)
    ));
}

fn set_count(name: &str, token: u64, count: u32) -> pb::request::Op {
    pb::request::Op::SetHoldCount(pb::SetHoldCount {
        name: name.into(),
        owner: "raw".into(),
        token,
        count,
    })
}

async fn hold_count(port: u16, name: &str) -> u32 {
    let described = grpc(port)
        .await
        .describe(pb::DescribeRequest { name: name.into() })
        .await
        .unwrap()
        .into_inner();
    described.lock.expect("held").holders[0].hold_count
}

/// The protocol's re-entry stays for callers that count nothing (a second
/// acquire of the same owner: same token, count + 1), and a caller that
/// counts itself, as the client library does, records its depth with
/// `SetHoldCount`: shown by inspection, checked like a release, never 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_count_is_the_protocols_re_entry_or_what_its_client_records() {
    let port = server().port();
    let mut session = RawSession::open(port, 10_000).await;
    let name = server_support::unique("hold-count");
    session.request(1, acquire_op(&name));
    let token = match session.reply(1).await {
        pb::reply::Result::Granted(g) => g.tokens[0],
        other => panic!("{other:?}"),
    };
    session.request(2, acquire_op(&name));
    match session.reply(2).await {
        pb::reply::Result::Granted(g) => assert_eq!(g.tokens, [token], "a re-entry"),
        other => panic!("{other:?}"),
    }
    assert_eq!(hold_count(port, &name).await, 2);

    // A server just started may still be agreeing on its record version.
    let mut id = 10;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        id += 1;
        session.request(id, set_count(&name, token, 5));
        match session.reply(id).await {
            pb::reply::Result::Done(_) => break,
            pb::reply::Result::Error(e) if e.code == pb::ErrorCode::Unsupported as i32 => {
                assert!(tokio::time::Instant::now() < deadline, "{e:?}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(hold_count(port, &name).await, 5);
    for (op, code) in [
        (set_count(&name, token, 0), pb::ErrorCode::InvalidArgument),
        (set_count(&name, token + 1, 2), pb::ErrorCode::NotOwner),
    ] {
        id += 1;
        session.request(id, op);
        match session.reply(id).await {
            pb::reply::Result::Error(e) => assert_eq!(e.code, code as i32, "{e:?}"),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(hold_count(port, &name).await, 5, "refusals changed nothing");

    // Back to one level: the next release ends the hold.
    for op in [set_count(&name, token, 1), release(&name)] {
        id += 1;
        session.request(id, op);
        assert!(matches!(
            session.reply(id).await,
            pb::reply::Result::Done(_)
        ));
    }
    assert!(holders(port, &name).await.is_empty());
}

/// A sessionless acquire of `name` for `owner` that waits up to a minute and
/// holds for a minute.
fn lease_request(name: &str, owner: &str) -> pb::AcquireLeaseRequest {
    pb::AcquireLeaseRequest {
        acquire: Some(pb::Acquire {
            names: vec![name.into()],
            owner: owner.into(),
            wait: pb::WaitKind::For as i32,
            wait_ms: 60_000,
            lease_ms: Some(60_000),
            ..Default::default()
        }),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unary_acquire_whose_caller_gives_up_leaves_no_hold() {
    let port = server().port();
    let mut holder = RawSession::open(port, 30_000).await;
    let mut caller = grpc(port).await;
    let deadline = std::time::Duration::from_millis(50);
    let mut names = Vec::new();
    // The holder lets go around the moment the caller gives up: before it,
    // at it and after it, so that the grant races the caller's departure
    // from every side (the outcome must not depend on which side wins).
    for (attempt, offset_ms) in (0u64..).zip((0..=30).step_by(3)) {
        let name = server_support::unique("lease-gives-up");
        let owner = format!("gives-up-{attempt}");
        let id = 2 * attempt + 1;
        holder.request(id, acquire_op(&name));
        assert!(matches!(
            holder.reply(id).await,
            pb::reply::Result::Granted(_)
        ));
        let call = {
            let mut caller = caller.clone();
            let request = lease_request(&name, &owner);
            tokio::spawn(async move {
                tokio::time::timeout(deadline, caller.acquire_lease(request)).await
            })
        };
        tokio::time::sleep(deadline - std::time::Duration::from_millis(15)).await;
        tokio::time::sleep(std::time::Duration::from_millis(offset_ms)).await;
        holder.request(id + 1, release(&name));
        assert!(matches!(
            holder.reply(id + 1).await,
            pb::reply::Result::Done(_)
        ));
        let answered = call.await.unwrap().is_ok();

        // What the caller does after giving up, as the API documents it:
        // release by name and owner, without a token.
        let undo = caller
            .release(pb::ReleaseRequest {
                release: Some(pb::Release {
                    name: name.clone(),
                    owner: owner.clone(),
                    token: None,
                }),
            })
            .await;
        if let Err(status) = &undo {
            assert_eq!(status.code(), Code::NotFound, "{status:?}");
        }
        // Nothing of the abandoned call outlives that release (its lease
        // would keep a hold for a minute).
        server_support::eventually(
            std::time::Duration::from_secs(5),
            &format!("no hold left (attempt {attempt}, answered: {answered})"),
            || async { holders(port, &name).await.is_empty() },
        )
        .await;
        names.push(name);
    }
    // Nor later: no grant came back after its release.
    for name in names {
        assert!(
            holders(port, &name).await.is_empty(),
            "{name} is held again"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unary_acquire_whose_caller_gives_up_while_queued_leaves_the_queue() {
    let port = server().port();
    let mut holder = RawSession::open(port, 30_000).await;
    let name = server_support::unique("lease-gives-up-queued");
    holder.request(1, acquire_op(&name));
    assert!(matches!(
        holder.reply(1).await,
        pb::reply::Result::Granted(_)
    ));
    let waiters = || async {
        grpc(port)
            .await
            .describe(pb::DescribeRequest { name: name.clone() })
            .await
            .unwrap()
            .into_inner()
            .lock
            .map(|l| l.waiters.len())
            .unwrap_or_default()
    };
    let mut caller = grpc(port).await;
    let call = caller.acquire_lease(lease_request(&name, "gives-up-queued"));
    let gave_up = tokio::select! {
        _ = call => false,
        () = async {
            server_support::eventually(
                std::time::Duration::from_secs(5),
                "the unary acquire is queued",
                || async { waiters().await == 1 },
            )
            .await
        } => true,
    };
    assert!(gave_up, "the call ended while the lock was held");
    // The call is gone (its future dropped): the server takes it out of the
    // queue, so the release below grants nobody.
    server_support::eventually(
        std::time::Duration::from_secs(5),
        "the abandoned wait leaves the queue",
        || async { waiters().await == 0 },
    )
    .await;
    holder.request(2, release(&name));
    assert!(matches!(holder.reply(2).await, pb::reply::Result::Done(_)));
    assert!(holders(port, &name).await.is_empty());
}
