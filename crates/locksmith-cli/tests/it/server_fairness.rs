//! One client must not stall or expire the others, against a real `locksmith
//! serve` process: a session with a long queue, a batch that keeps the engine
//! busy past another session's TTL (the heavy clients, one that never reads
//! and a big table listed in pages, are in `server_heavy_clients`; both
//! modules run alone, see `.config/nextest.toml`). The assertions are about
//! behaviour (the well-behaved client keeps its session and its lock), never
//! about durations.
//!
//! Needs the CLI binary, so it lives in locksmith-cli and not with the
//! server's own tests in locksmith-server: it starts `locksmith serve` as a
//! process, to test the server as an operator runs it (flags, data
//! directory, signals, restarts).

use crate::server_support;

use std::time::Duration;

use locksmith_proto::v1 as pb;
use pb::client_message::Kind as Out;
use server_support::{unique, RawSession, ServerProcess};

/// Acquire requests of `owner` on `name` that wait forever and say when
/// they are queued.
fn waiting_acquire(id: u64, name: &str, owner: String) -> Out {
    Out::Request(pb::Request {
        id,
        op: Some(pb::request::Op::Acquire(pb::Acquire {
            names: vec![name.into()],
            owner,
            wait: pb::WaitKind::Forever as i32,
            notify_queued: true,
            ..Default::default()
        })),
    })
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_with_a_long_queue_slows_nobody_else() {
    const QUEUED: u64 = 40_000;
    const PER_BATCH: u64 = 2_000;
    let server = ServerProcess::start_with(&["--max-waiters-per-lock", "100000"]);
    // The well-behaved client: heartbeats every second, a 3 s TTL.
    let client = server.client(Duration::from_secs(3)).await;
    let name = unique("long-queue");
    let guard = client.lock(name.as_str()).acquire().await.unwrap();

    // The other one holds a lock and queues tens of thousands of requests on
    // it from the same session, all sent at once.
    let mut flood = RawSession::open(server.port(), 30_000).await;
    let blocker = unique("long-queue-blocker");
    flood.send(waiting_acquire(0, &blocker, "holder".into()));
    replies(&mut flood, 1).await;
    for first in (1..=QUEUED).step_by(PER_BATCH as usize) {
        flood.send_batch(
            (first..first + PER_BATCH)
                .map(|id| waiting_acquire(id, &blocker, format!("waiter-{id}")))
                .collect(),
        );
    }
    tokio::select! {
        _ = replies(&mut flood, QUEUED as usize) => {}
        reason = guard.lost() => panic!("the well-behaved client lost its lock: {reason}"),
    }

    server.assert_running();
    assert!(!guard.is_lost(), "{:?}", guard.lost_signal().reason());
    guard
        .release()
        .await
        .expect("the session lived through the flood");
    let again = client.lock(name.as_str()).try_acquire().await.unwrap();
    assert!(again.is_some());
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_never_expires_while_its_heartbeat_is_queued() {
    const HOLDS: u64 = 200_000;
    const PER_BATCH: u64 = 4_000;
    // Above the default limit, so that closing the session takes long.
    let server = ServerProcess::start_with(&["--max-holds-per-session", "200000"]);
    let port = server.port();
    // The well-behaved client: a short TTL, a heartbeat every fifth of it.
    let ttl = Duration::from_millis(1_000);
    let mut good = RawSession::open(port, ttl.as_millis() as u64).await;
    let name = unique("queued-heartbeat");
    assert!(matches!(
        good.acquire(1, &name, pb::WaitKind::No).await,
        pb::reply::Result::Granted(_)
    ));
    let mut beat = tokio::time::interval(ttl / 5);

    // The other client holds many locks, then closes its session: a single
    // command that keeps the engine busy longer than the good client's TTL,
    // while the good client's heartbeats queue up.
    let mut big = RawSession::open(port, 60_000).await;
    let prefix = unique("queued-heartbeat-many");
    for first in (1..=HOLDS).step_by(PER_BATCH as usize) {
        big.send_batch(acquires(first, PER_BATCH, &prefix));
        let mut granted = 0;
        while granted < PER_BATCH {
            tokio::select! {
                _ = beat.tick() => good.send(Out::Heartbeat(pb::Heartbeat {})),
                message = big.next() => match message {
                    Some(pb::server_message::Kind::Reply(pb::Reply {
                        result: Some(pb::reply::Result::Granted(_)), ..
                    })) => granted += 1,
                    other => panic!("{other:?}"),
                },
            }
        }
    }
    let started = std::time::Instant::now();
    big.send(Out::Close(pb::Close {}));
    loop {
        tokio::select! {
            _ = beat.tick() => good.send(Out::Heartbeat(pb::Heartbeat {})),
            message = big.next() => match message {
                Some(pb::server_message::Kind::Ended(_)) | None => break,
                Some(_) => {}
            },
        }
    }
    eprintln!(
        "closing the session with {HOLDS} holds took {:?}",
        started.elapsed()
    );

    // The good client's session and lock are intact: up to the answer of a
    // new request, it got heartbeat answers and nothing else.
    good.send(waiting_acquire(
        2,
        &unique("queued-heartbeat-probe"),
        "raw".into(),
    ));
    loop {
        match good.next().await {
            Some(pb::server_message::Kind::Heartbeat(_)) => {}
            Some(pb::server_message::Kind::Reply(pb::Reply { id: 2, result })) => {
                assert!(
                    matches!(
                        result,
                        Some(pb::reply::Result::Queued(_) | pb::reply::Result::Granted(_))
                    ),
                    "{result:?}"
                );
                break;
            }
            other => panic!("the well-behaved session got {other:?}"),
        }
    }
    let described = server_support::grpc(port)
        .await
        .describe(pb::DescribeRequest { name: name.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        described.lock.unwrap().holders[0].session_id,
        good.session_id
    );
}
