//! A `locksmith://` URL that lists several members: the client talks to the
//! first one that serves and moves on when its member goes away, against
//! real `locksmith serve` processes.

mod server_support;

use std::time::Duration;

use locksmith::{Client, ConnectOptions};
use locksmith_testkit::free_port;
use server_support::{cluster_flag, eventually, unique, ServerProcess};

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
    let url = format!(
        "locksmith://127.0.0.1:{},127.0.0.1:{}",
        first.port(),
        second.port()
    );
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

/// A member whose peers never answer says so once per election round, not
/// on every tick of openraft's timer: at openraft's info level that is
/// about 66 lines a second, which the server's default filter leaves out
/// (set `LOCKSMITH_SERVE_LOG` to something else and this test means nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_waiting_for_its_peers_does_not_flood_its_log() {
    let ports = [free_port(), free_port(), free_port()];
    let list = cluster_flag(&ports);
    let member = ServerProcess::start_on(ports[0], &["--node-id", "1", "--cluster", &list]);
    // Each round asks both absent peers for a pre-vote, an election timeout
    // after the round before.
    eventually(
        Duration::from_secs(30),
        "three rounds of pre-votes",
        || async {
            member
                .log_tail(1000)
                .matches("while requesting pre-vote")
                .count()
                >= 6
        },
    )
    .await;
    let log = member.log_tail(1000);
    assert!(
        !log.contains("election timeout expired"),
        "a line on every tick:\n{log}"
    );
    assert!(log.lines().count() < 100, "{log}");
}
