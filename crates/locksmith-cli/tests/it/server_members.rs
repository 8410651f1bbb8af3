//! A `locksmith://` URL that lists several members: the client talks to the
//! first one that serves and moves on when its member goes away, against
//! real `locksmith serve` processes.
//!
//! Needs the CLI binary, so it lives in locksmith-cli and not with the
//! server's own tests in locksmith-server: it starts `locksmith serve` as a
//! process, to test the server as an operator runs it (flags, data
//! directory, signals, restarts).

use crate::server_support;

use std::time::Duration;

use locksmith::{Client, ConnectOptions};
use locksmith_testkit::free_port;
use server_support::{eventually, members_url, unique, ServerProcess};

async fn connect(url: &str, session_ttl: Duration) -> Client {
    let options = ConnectOptions::default().session_ttl(session_ttl);
    Client::connect_with(url, options)
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_is_down_is_skipped() {
    let server = ServerProcess::start();
    let down = free_port();
    let url = format!("locksmith://127.0.0.1:{down},127.0.0.1:{}", server.port());
    let client = connect(&url, Duration::from_secs(5)).await;
    let name = unique("skip-a-member-that-is-down");
    let guard = client.lock(&name).acquire().await.expect("acquire");
    let info = client.describe(&name).await.unwrap().expect("held");
    assert_eq!(info.holders[0].fencing_token, Some(guard.fencing_token()));
    guard.release().await.expect("release");
    client.close().await.unwrap();
}

/// A member that takes the connection but answers nothing (frozen here)
/// gets its share of the connect's patience, not all of it: with all of
/// it, the client gave up before it tried the member that serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_member_is_skipped() {
    let (frozen, serving) = (ServerProcess::start(), ServerProcess::start());
    frozen.pause();
    let url = members_url(&[frozen.port(), serving.port()]);
    let client = connect(&url, Duration::from_secs(4)).await;
    let name = unique("skip-a-frozen-member");
    let guard = client.lock(&name).acquire().await.expect("acquire");
    guard.release().await.expect("release");
    client.close().await.unwrap();
    frozen.unpause();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_member_serving_is_a_clear_error() {
    let (a, b) = (free_port(), free_port());
    let url = format!("locksmith://127.0.0.1:{a},127.0.0.1:{b}");
    let options = ConnectOptions::default().session_ttl(Duration::from_secs(2));
    let Err(error) = Client::connect_with(&url, options).await else {
        panic!("connected although nobody serves");
    };
    let message = error.to_string();
    assert!(message.contains(&format!("127.0.0.1:{b}")), "{message}");
}

/// Two separate servers (not a cluster): when the client's member dies, the
/// client reaches the other one, which does not know its session, so the
/// holds are reported lost and a new session serves new acquires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_moves_to_the_next_member_when_its_member_dies() {
    let first = ServerProcess::start();
    let second = ServerProcess::start();
    let url = members_url(&[first.port(), second.port()]);
    let client = connect(&url, Duration::from_secs(2)).await;
    let name = unique("moves-to-the-next-member");
    let guard = client.lock(&name).acquire().await.expect("acquire");
    assert!(first
        .client(Duration::from_secs(2))
        .await
        .describe(&name)
        .await
        .unwrap()
        .is_some());

    first.kill();
    let reason = tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the hold is reported lost");
    assert!(reason.contains("session"), "{reason}");
    let again = tokio::time::timeout(Duration::from_secs(10), client.lock(&name).acquire())
        .await
        .expect("served by the second member")
        .expect("acquire on the second member");
    let on_second = second
        .client(Duration::from_secs(2))
        .await
        .describe(&name)
        .await
        .unwrap()
        .expect("held on the second member");
    assert_eq!(
        on_second.holders[0].fencing_token,
        Some(again.fencing_token())
    );
    again.release().await.unwrap();
    client.close().await.unwrap();
}

/// A member that is down is logged once by each member that misses it, and
/// its return once; openraft's own lines, one per tick while a member waits
/// for votes and one per failed heartbeat, stay out of the default log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_is_down_is_logged_once_and_its_return_once() {
    let ports = [free_port(), free_port(), free_port()];
    let start = |i: usize| ServerProcess::start_member(&ports, i, &[]);
    let (first, second) = (start(0), start(1));
    let client = ServerProcess::client_of(&ports[..2]).await;
    let name = unique("member-down-logged-once");
    let guard = client.lock(&name).acquire().await.unwrap();
    guard.release().await.unwrap();
    let logs = || [first.log_tail(1000), second.log_tail(1000)];
    let missing_3 = "member does not answer member=3";
    eventually(
        Duration::from_secs(30),
        "the leader misses member 3",
        || async { logs().iter().any(|log| log.contains(missing_3)) },
    )
    .await;
    // A second of heartbeats to member 3, twenty of them: each was a line.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let third = start(2);
    eventually(
        Duration::from_secs(30),
        "the leader hears member 3 again",
        || async {
            logs()
                .iter()
                .any(|log| log.contains("member answers again member=3"))
        },
    )
    .await;
    for log in logs() {
        assert!(!log.contains("openraft::"), "openraft's lines:\n{log}");
        assert!(log.matches(missing_3).count() <= 2, "{log}");
        assert!(log.lines().count() < 60, "{log}");
    }
    client.close().await.unwrap();
    drop(third);
}
