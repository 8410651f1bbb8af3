//! Clients that load the server heavily, against a real `locksmith serve`
//! process: one that sends and never reads its replies (its stream is closed
//! once its backlog passes the limit; nobody else notices; its session
//! resumes), and a table big enough that listings come in pages.
//!
//! Needs the CLI binary, so it lives in locksmith-cli and not with the
//! server's own tests in locksmith-server: it starts `locksmith serve` as a
//! process, to test the server as an operator runs it (flags, data
//! directory, signals, restarts).

use crate::server_support;

use std::time::Duration;

use locksmith_proto::v1 as pb;
use pb::client_message::Kind as Out;
use server_support::{eventually, unique, RawSession, ServerProcess};
use tonic::Code;

/// Reads `count` replies (any kind), panicking on an error reply.
async fn replies(session: &mut RawSession, count: usize) {
    let mut seen = 0;
    while seen < count {
        match session.next().await {
            Some(pb::server_message::Kind::Reply(pb::Reply {
                result: Some(pb::reply::Result::Error(e)),
                ..
            })) => panic!("{e:?}"),
            Some(pb::server_message::Kind::Reply(_)) => seen += 1,
            Some(_) => {}
            None => panic!("the stream ended after {seen} of {count} replies"),
        }
    }
}

/// `count` exclusive acquires (no wait) of distinct locks under `prefix`.
fn acquires(first_id: u64, count: u64, prefix: &str) -> Vec<Out> {
    (first_id..first_id + count)
        .map(|id| {
            Out::Request(pb::Request {
                id,
                op: Some(pb::request::Op::Acquire(pb::Acquire {
                    names: vec![format!("{prefix}/{id}")],
                    owner: "many".into(),
                    ..Default::default()
                })),
            })
        })
        .collect()
}

/// A renew of `name` by an owner that does not hold it: answered at once
/// with an error, and kept nowhere.
fn renew_not_held(id: u64, name: &str) -> Out {
    Out::Request(pb::Request {
        id,
        op: Some(pb::request::Op::Renew(pb::Renew {
            name: name.into(),
            owner: "nobody".into(),
            ..Default::default()
        })),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_is_disconnected_and_may_resume() {
    const REQUESTS: u64 = 100_000;
    const PER_BATCH: u64 = 5_000;
    let server = ServerProcess::start_with(&["--max-stream-backlog-bytes", "1048576"]);
    // The bystander's heartbeats wait behind the flood's batches already in
    // the log (up to `max_batches_in_flight` of them): 0.1–0.3 s with this
    // debug build on a quiet machine, several times that on a loaded one. A
    // 3 s TTL, whose client gives up once a heartbeat waits about 1.85 s for
    // its answer, lost its session in a loaded run; 10 s keeps the check
    // about the flood's stream, not about the machine's load.
    let client = server.client(Duration::from_secs(10)).await;
    let name = unique("never-reads");
    let guard = client.lock(name.as_str()).acquire().await.unwrap();

    // Sends a hundred thousand requests and reads none of the replies: far
    // more than the HTTP/2 windows and the 1 MiB backlog hold.
    let mut flood = RawSession::open(server.port(), 30_000).await;
    let missing = unique("never-reads-missing");
    for first in (1..=REQUESTS).step_by(PER_BATCH as usize) {
        flood.send_batch(
            (first..first + PER_BATCH)
                .map(|id| renew_not_held(id, &missing))
                .collect(),
        );
    }
    eventually(
        Duration::from_secs(60),
        "the server closes the stream of the client that does not read",
        || async { server.log_tail(40).contains("does not read its replies") },
    )
    .await;

    // What was queued before the limit arrives, then the reason.
    let (read, end) = flood.drain().await;
    let status = end.expect("the stream ends with a status, not cleanly");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("too slow to read"), "{status:?}");
    assert!((read as u64) < REQUESTS, "every reply was queued: {read}");

    // The session lives on by the normal rules: it resumes on a new stream
    // and is served there.
    let mut resumed =
        RawSession::resume(server.port(), flood.session_id, flood.secret.clone()).await;
    let probe = unique("never-reads-probe");
    assert!(matches!(
        resumed
            .acquire(REQUESTS + 1, &probe, pb::WaitKind::No)
            .await,
        pb::reply::Result::Granted(_)
    ));

    // Nobody else noticed.
    server.assert_running();
    assert!(!guard.is_lost(), "{:?}", guard.lost_signal().reason());
    guard
        .release()
        .await
        .expect("the well-behaved session is intact");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_table_is_listed_in_pages() {
    const HOLDS: u64 = 25_000;
    const PER_BATCH: u64 = 5_000;
    let server =
        ServerProcess::start_with(&["--snapshot-every", "3", "--snapshot-log-percent", "0"]);
    let port = server.port();
    let mut many = RawSession::open(port, 60_000).await;
    let prefix = unique("big-table");
    for first in (1..=HOLDS).step_by(PER_BATCH as usize) {
        many.send_batch(acquires(first, PER_BATCH, &prefix));
        replies(&mut many, PER_BATCH as usize).await;
    }

    // One call answers one page, never the whole table: the engine thread
    // copies at most a page per call.
    let mut grpc = server_support::grpc(port).await;
    let list = |after: String, limit: u32| pb::ListRequest {
        prefix: prefix.clone(),
        limit,
        after,
    };
    let first = grpc
        .list(list(String::new(), 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.locks.len(), 10_000);
    assert_eq!(first.next_after, first.locks.last().unwrap().name);
    let small = grpc
        .list(list(String::new(), 7))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(small.locks.len(), 7);

    // Page by page, every lock once, in order.
    let mut names = Vec::new();
    let mut after = String::new();
    loop {
        let page = grpc.list(list(after, 4_000)).await.unwrap().into_inner();
        names.extend(page.locks.into_iter().map(|l| l.name));
        if page.next_after.is_empty() {
            break;
        }
        after = page.next_after;
    }
    let mut expected: Vec<String> = (1..=HOLDS).map(|id| format!("{prefix}/{id}")).collect();
    expected.sort();
    assert_eq!(names, expected);

    // The library pages through on its own.
    let client = server.client(Duration::from_secs(10)).await;
    assert_eq!(client.list(&prefix).await.unwrap().len(), HOLDS as usize);

    // Snapshots were taken meanwhile (one every 3 entries), off the engine
    // thread, and a restart after kill -9 comes back from them with every
    // hold.
    server.kill();
    server.restart();
    let client = server.client(Duration::from_secs(10)).await;
    assert_eq!(client.list(&prefix).await.unwrap().len(), HOLDS as usize);
}
