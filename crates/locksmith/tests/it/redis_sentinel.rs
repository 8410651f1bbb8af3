//! The Redis backend behind Sentinel (`redis+sentinel://`), against a real
//! primary with two replicas and three Sentinels started by locksmith-testkit:
//! the conformance suite (also with every port on TLS only), what a failover
//! does to holds and waiters, and replica acknowledgement.

use crate::redis_support;

use std::time::Duration;

use locksmith::{Error, Undo};
use locksmith_testkit::conformance::run_suite;
use locksmith_testkit::{Redis, RedisSentinel, RespValue};
use redis_support::{client, eventually, refused, suite_url, unique, with_client_cert, Harness};
use tokio::time::timeout;

/// Starts a setup whose Sentinels fail no primary over by themselves (they
/// wait 5 s), letting the runtime's other tasks run meanwhile.
async fn start() -> RedisSentinel {
    tokio::task::block_in_place(RedisSentinel::start_steady)
}

fn backend_message(error: &Error) -> String {
    match error {
        Error::Backend { source, .. } => source.to_string(),
        other => panic!("expected a backend error, got {other:?}"),
    }
}

fn replicas<'a>(setup: &'a RedisSentinel, primary: &Redis) -> Vec<&'a Redis> {
    setup
        .nodes()
        .iter()
        .filter(|n| n.port() != primary.port())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_suite_behind_sentinel() {
    let setup = start().await;
    run_suite(Harness::new(suite_url(&setup.url()))).await;
}

/// The suite over TLS: every port of the setup, the Sentinels' too, speaks
/// only TLS and lets in only clients with a certificate of its CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_suite_behind_sentinel_over_tls() {
    let setup = tokio::task::block_in_place(RedisSentinel::start_tls);
    let ca = setup.certificates().expect("a TLS setup");
    let url = with_client_cert(&setup.url(), ca, "suite");
    assert!(url.starts_with("rediss+sentinel://"), "{url}");
    run_suite(Harness::new(suite_url(&url))).await;
}

/// Behind a TLS-only Sentinel setup a plaintext client, and a TLS client
/// without a client certificate, are refused; one with a certificate of the
/// setup's CA gets a lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_sentinel_setup_refuses_plaintext_and_certificateless_clients() {
    let setup = tokio::task::block_in_place(RedisSentinel::start_tls);
    let ca = setup.certificates().expect("a TLS setup");
    let sentinels = setup
        .sentinels()
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect::<Vec<_>>()
        .join(",");
    let plaintext = refused(&format!(
        "redis+sentinel://{sentinels}/{}",
        setup.master_name()
    ))
    .await;
    assert!(plaintext.contains("no Sentinel"), "{plaintext}");
    refused(&setup.url()).await;
    let url = with_client_cert(&setup.url(), ca, "client");
    let client = client(&url, Duration::from_secs(10)).await;
    let guard = client.lock(unique("tls").as_str()).acquire().await.unwrap();
    guard.release().await.unwrap();
}

/// After a failover the client talks to the new primary: holds the new
/// primary has stay held (and renewed), a hold it lacks fires `lost` at once
/// (the watchdog re-checks every hold after the switch), and waiters listen on
/// the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_keeps_the_holds_the_new_primary_has_and_loses_the_rest() {
    // Sentinels that call a primary down after 1 s, for a quick failover.
    let setup = tokio::task::block_in_place(RedisSentinel::start);
    // No acknowledgement: the test decides what the replicas have.
    let url = format!("{}?wait_replicas=0", setup.url());
    // Renewals come every 40 s: only the re-check after the switch can find
    // the lost hold within the test.
    let ttl = Duration::from_secs(120);
    let holder = client(&url, ttl).await;
    let (kept_name, lost_name) = (unique("kept"), unique("lost"));
    let kept = holder.lock(kept_name.as_str()).acquire().await.unwrap();
    let lost = holder.lock(lost_name.as_str()).acquire().await.unwrap();
    let waiting = client(&url, ttl).await;
    let waiter = tokio::spawn({
        let lock = waiting.lock(kept_name.as_str());
        async move { lock.acquire_timeout(Duration::from_secs(60)).await }
    });
    let old = setup.primary();
    let channel = format!("redisson_lock__channel:{{{kept_name}}}");
    let subscribers = |node: &Redis| match node.query(&["PUBSUB", "NUMSUB", &channel]) {
        Ok(RespValue::Array(Some(reply))) => reply[1].as_int(),
        _ => None,
    };
    eventually(Duration::from_secs(10), "the waiter subscribes", || {
        subscribers(old) == Some(1)
    })
    .await;

    // Stands in for a grant the primary acknowledged but had not sent to any
    // replica when it died: the replicas drop it.
    for replica in replicas(&setup, old) {
        eventually(
            Duration::from_secs(10),
            "the replica has both holds",
            || replica.query(&["EXISTS", &kept_name, &lost_name]).unwrap() == RespValue::Integer(2),
        )
        .await;
        replica
            .query(&["CONFIG", "SET", "replica-read-only", "no"])
            .unwrap();
        replica
            .query(&[
                "DEL",
                &lost_name,
                &format!("locksmith_meta:{{{lost_name}}}"),
            ])
            .unwrap();
        replica
            .query(&["CONFIG", "SET", "replica-read-only", "yes"])
            .unwrap();
    }
    old.kill();
    tokio::task::block_in_place(|| setup.wait_for_failover(old)).unwrap();
    let reason = timeout(Duration::from_secs(30), lost.lost())
        .await
        .expect("the re-check after the switch finds the hold gone");
    assert!(reason.contains("no longer held"), "{reason}");
    assert!(
        !kept.is_lost(),
        "the hold the new primary has is kept: {:?}",
        kept.lost_signal().reason()
    );
    let kept_token = kept.fencing_token();
    kept.release().await.expect("released on the new primary");
    let next = waiter
        .await
        .unwrap()
        .expect("the waiter follows the primary and gets the lock");
    assert!(next.fencing_token() > kept_token);
    let other = client(&url, ttl).await;
    assert!(
        other
            .lock(lost_name.as_str())
            .try_acquire()
            .await
            .unwrap()
            .is_some(),
        "the lost lock is free on the new primary"
    );
    assert!(matches!(lost.release().await, Err(Error::Lost(_))));
}

/// Checks that `error` reports a grant of `name` that none of the replicas
/// (all `connected`, none acknowledging) acknowledged within the default
/// 1 s, and that was given back: its kind and its text.
fn assert_unacknowledged(error: &Error, name: &str, connected: u32) {
    let Error::Unreplicated(report) = error else {
        panic!("expected Error::Unreplicated, got {error:?}");
    };
    assert_eq!(report.name, name);
    assert_eq!((report.acknowledged, report.asked), (0, 1), "{error}");
    assert_eq!(report.within, Duration::from_secs(1), "{error}");
    assert_eq!(report.connected, Some(connected), "{error}");
    assert_eq!(report.undo, Undo::GivenBack, "{error}");
    let text = error.to_string();
    for part in [
        "only 0 of 1 replicas acknowledged it within 1s",
        &format!("({connected} connected to the primary)"),
        "the grant was given back",
    ] {
        assert!(text.contains(part), "{text:?} lacks {part:?}");
    }
}

/// By default a grant behind Sentinel waits until a replica has it (`WAIT 1`),
/// so the replica a failover promotes has it too. When no replica
/// acknowledges, the grant is given back before the acquire returns, the
/// error says what happened (it is no conflict: nobody else holds the
/// lock), a waiting acquire says so before its wait runs out, and another
/// client gets the lock at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_wait_for_a_replica_by_default() {
    let setup = start().await;
    let acked = client(&setup.url(), Duration::from_secs(30)).await;
    let name = unique("acked");
    let guard = acked.lock(name.as_str()).acquire().await.unwrap();
    let primary = setup.primary();
    let on_replicas = replicas(&setup, primary)
        .iter()
        .filter(|r| r.query(&["EXISTS", &name]).unwrap() == RespValue::Integer(1))
        .count();
    assert!(on_replicas >= 1, "WAIT 1 returned: a replica has the grant");
    guard.release().await.unwrap();

    // Stopped replicas stay connected to the primary but acknowledge nothing.
    for replica in replicas(&setup, primary) {
        replica.pause();
    }
    let other = unique("unacked");
    let left_behind = || {
        let meta = format!("locksmith_meta:{{{other}}}");
        primary.query(&["EXISTS", &other, &meta]).unwrap()
    };
    let error = acked.lock(other.as_str()).try_acquire().await.unwrap_err();
    assert_unacknowledged(&error, &other, 2);
    assert_eq!(left_behind(), RespValue::Integer(0), "the grant is gone");

    // A waiting acquire tries again while another attempt fits in its wait,
    // then gives the reason, not a timeout, and leaves nothing either.
    let wait = Duration::from_secs(3);
    let started = std::time::Instant::now();
    let error = acked
        .lock(other.as_str())
        .acquire_timeout(wait)
        .await
        .unwrap_err();
    assert!(started.elapsed() < wait, "answered within its wait");
    assert_unacknowledged(&error, &other, 2);
    assert_eq!(left_behind(), RespValue::Integer(0), "the grant is gone");

    let unacked = client(
        &format!("{}?wait_replicas=0", setup.url()),
        Duration::from_secs(30),
    )
    .await;
    let granted = timeout(
        Duration::from_secs(1),
        unacked.lock(other.as_str()).try_acquire(),
    )
    .await
    .expect("answered at once")
    .unwrap();
    assert!(granted.is_some(), "the unacknowledged grant was given back");
    for replica in replicas(&setup, primary) {
        replica.resume();
    }
}

/// The bound on a failover's unavailability for grants, from the moment
/// the Sentinels name the new primary: they reconfigure the remaining
/// replica at once (`parallel-syncs`), and it catches up by a partial
/// resync, or a full one of a small data set, in about a second; the
/// client finds the new primary within a second.
const GRANTS_RESUME_WITHIN: Duration = Duration::from_secs(20);

/// A failover that leaves one replica (the old primary stays down): grants,
/// which wait for one replica's acknowledgement, resume once the remaining
/// replica follows the new primary; until then each attempt fails with an
/// error saying why (or that the primary is being replaced), never with a
/// conflict, and leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_resume_after_a_failover_with_one_replica_left() {
    // Sentinels that call a primary down after 1 s, for a quick failover.
    let setup = tokio::task::block_in_place(RedisSentinel::start);
    let client = client(&setup.url(), Duration::from_secs(15)).await;
    let before = client
        .lock(unique("before").as_str())
        .acquire()
        .await
        .unwrap();
    before.release().await.unwrap();
    let old = setup.primary();
    old.kill();
    let new = tokio::task::block_in_place(|| setup.wait_for_failover(old)).unwrap();
    let promoted = std::time::Instant::now();
    let mut failures = Vec::new();
    loop {
        let name = unique("after");
        match client.lock(name.as_str()).try_acquire().await {
            Ok(Some(guard)) => {
                guard.release().await.unwrap();
                break;
            }
            Ok(None) => panic!("{name} is busy: nobody else holds it"),
            Err(error) => {
                assert!(
                    matches!(error, Error::Unreplicated(_) | Error::Backend { .. }),
                    "{error:?}"
                );
                let meta = format!("locksmith_meta:{{{name}}}");
                assert_eq!(
                    new.query(&["EXISTS", &name, &meta]).unwrap(),
                    RespValue::Integer(0),
                    "a failed attempt leaves nothing: {error}"
                );
                failures.push(format!("{:?}: {error}", promoted.elapsed()));
            }
        }
        assert!(
            promoted.elapsed() < GRANTS_RESUME_WITHIN,
            "no grant within {GRANTS_RESUME_WITHIN:?} of the promotion:\n{}",
            failures.join("\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "granted {:?} after the promotion, after {} failed attempts",
        promoted.elapsed(),
        failures.len()
    );
}

#[test]
fn bad_sentinel_urls_are_clear_errors() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let error = locksmith::Client::connect("redis+sentinel://127.0.0.1:1,127.0.0.1:2")
            .await
            .unwrap_err();
        assert!(error.to_string().contains("master name"), "{error}");
        let port = locksmith_testkit::free_port();
        let error = locksmith::Client::connect(&format!("redis+sentinel://127.0.0.1:{port}/m"))
            .await
            .unwrap_err();
        assert!(backend_message(&error).contains("no Sentinel"), "{error}");
    });
}
