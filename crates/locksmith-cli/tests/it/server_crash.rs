//! Crash and restart tests against real `locksmith serve` processes: kill -9 of
//! the server under load, restarts with held locks and queued waiters, clients
//! that die or fall silent.
//!
//! Needs the CLI binary, so it lives in locksmith-cli and not with the
//! server's own tests in locksmith-server: it starts `locksmith serve` as a
//! process, to test the server as an operator runs it (flags, data
//! directory, signals, restarts).

use crate::server_support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use locksmith::{Client, Guard};
use locksmith_proto::v1 as pb;
use server_support::{eventually, unique, RawSession, ServerProcess, BINARY};
use tokio::time::{sleep, timeout, Instant};

/// One grant a client received: when, on which lock, with which token.
#[derive(Debug, Clone)]
struct Received {
    at: Instant,
    name: String,
    token: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_under_load_loses_no_grant_and_tokens_only_grow() {
    // Small snapshot interval: the load crosses many snapshots and log
    // segments, and the crash lands between two of them.
    let server = ServerProcess::start_with(&[
        "--grace",
        "30s",
        "--snapshot-every",
        "20",
        "--snapshot-log-percent",
        "0",
    ]);
    let ttl = Duration::from_secs(10);
    let base = unique("load");

    // Long-lived holders: their grants must survive the crash.
    let holder = server.client(ttl).await;
    let exclusive = holder
        .lock(format!("{base}/held-x"))
        .acquire()
        .await
        .unwrap();
    let shared = holder
        .rw_lock(format!("{base}/held-rw"))
        .read()
        .acquire()
        .await
        .unwrap();
    let permit = holder
        .semaphore(format!("{base}/held-sem"), 2)
        .acquire()
        .await
        .unwrap();
    let held = [
        (format!("{base}/held-x"), exclusive.fencing_token()),
        (format!("{base}/held-rw"), shared.fencing_token()),
        (format!("{base}/held-sem"), permit.fencing_token()),
    ];

    // Churners: acquire, record, release, as fast as they can, across the crash.
    let received = Arc::new(Mutex::new(Vec::<Received>::new()));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut churners = Vec::new();
    for c in 0..6 {
        let client = server.client(ttl).await;
        let (received, failures, stop) = (received.clone(), failures.clone(), stop.clone());
        let base = base.clone();
        churners.push(tokio::spawn(async move {
            let mut round = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let name = format!("{base}/churn-{}", (c + round) % 4);
                round += 1;
                let guard = match client
                    .lock(name.as_str())
                    .acquire_timeout(Duration::from_secs(60))
                    .await
                {
                    Ok(guard) => guard,
                    Err(e) => {
                        failures
                            .lock()
                            .unwrap()
                            .push(format!("acquire {name}: {e}"));
                        return;
                    }
                };
                received.lock().unwrap().push(Received {
                    at: Instant::now(),
                    name: name.clone(),
                    token: guard.fencing_token(),
                });
                if round % 3 == 0 {
                    sleep(Duration::from_millis(2)).await;
                }
                if let Err(e) = guard.release().await {
                    failures
                        .lock()
                        .unwrap()
                        .push(format!("release {name}: {e}"));
                    return;
                }
            }
        }));
    }

    let count = || received.lock().unwrap().len();
    eventually(Duration::from_secs(20), "load before the crash", || async {
        count() > 300
    })
    .await;
    server.kill();
    let killed = Instant::now();
    let before_restart = count();
    sleep(Duration::from_millis(300)).await;
    server.restart();
    eventually(
        Duration::from_secs(30),
        "load after the restart",
        || async { count() > before_restart + 300 },
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    for churner in churners {
        timeout(Duration::from_secs(60), churner)
            .await
            .expect("churner finishes")
            .unwrap();
    }
    let failures = failures.lock().unwrap().clone();
    assert!(failures.is_empty(), "{failures:?}\n{}", server.log_tail(30));

    // Holders still hold, with the same tokens, and were never told otherwise.
    for guard in [&exclusive, &shared, &permit] {
        assert!(!guard.is_lost(), "lost: {:?}", guard.lost_signal().reason());
    }
    for (name, token) in &held {
        let info = holder.describe(name).await.unwrap().expect("still held");
        assert_eq!(info.holders.len(), 1, "{info:?}");
        assert_eq!(info.holders[0].fencing_token, Some(*token));
    }

    // Per lock, every token received after the crash is above every token
    // received before it (a grant acknowledged before the crash is never
    // handed out again).
    let received = received.lock().unwrap().clone();
    let mut by_lock: HashMap<&str, (u64, u64)> = HashMap::new();
    for r in &received {
        let entry = by_lock.entry(r.name.as_str()).or_insert((0, u64::MAX));
        if r.at < killed {
            entry.0 = entry.0.max(r.token);
        } else {
            entry.1 = entry.1.min(r.token);
        }
    }
    for (name, (max_before, min_after)) in &by_lock {
        assert!(
            min_after > max_before,
            "{name}: token {min_after} after the crash, {max_before} before"
        );
    }
    // And the counter itself never went back: a new grant tops everything.
    let all_before = received
        .iter()
        .filter(|r| r.at < killed)
        .map(|r| r.token)
        .max()
        .unwrap();
    let fresh = holder
        .lock(format!("{base}/fresh"))
        .acquire()
        .await
        .unwrap();
    assert!(fresh.fencing_token() > all_before);
    assert!(fresh.fencing_token() > held.iter().map(|h| h.1).max().unwrap());

    for guard in [exclusive, shared, permit, fresh] {
        guard.release().await.expect("release after the restart");
    }
    server.assert_running();
    let log = server.log_tail(2000);
    assert!(
        log.matches("snapshot written").count() >= 4,
        "the load should cross several snapshots"
    );
}

async fn holds_and_queue_survive(restart: impl FnOnce(&ServerProcess)) {
    let server = ServerProcess::start();
    let ttl = Duration::from_secs(5);
    let (a, b) = (server.client(ttl).await, server.client(ttl).await);
    let name = unique("survive");
    let x = a
        .lock(format!("{name}/x"))
        .owner("alpha")
        .acquire()
        .await
        .unwrap();
    let again = a
        .lock(format!("{name}/x"))
        .owner("alpha")
        .acquire()
        .await
        .unwrap();
    let r = a
        .rw_lock(format!("{name}/rw"))
        .read()
        .acquire()
        .await
        .unwrap();
    let s = a
        .semaphore(format!("{name}/sem"), 3)
        .acquire()
        .await
        .unwrap();
    let m = a
        .multi_lock([format!("{name}/m1"), format!("{name}/m2")])
        .acquire()
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let lock = b.lock(format!("{name}/x")).owner("beta");
        async move { lock.acquire().await }
    });
    let x_name = format!("{name}/x");
    eventually(Duration::from_secs(10), "b queued", || async {
        a.describe(&x_name)
            .await
            .unwrap()
            .is_some_and(|i| i.waiters.len() == 1)
    })
    .await;

    restart(&server);

    // The queue survived: b is still waiting behind alpha's two-level hold.
    let info = eventually_describe(&a, &x_name).await;
    assert_eq!(info.holders[0].owner, "alpha");
    assert_eq!(info.holders[0].hold_count, 2);
    assert_eq!(info.holders[0].fencing_token, Some(x.fencing_token()));
    assert_eq!(info.waiters.len(), 1);
    assert_eq!(info.waiters[0].owner, "beta");
    for guard in [&x, &again, &r, &s, &m] {
        assert!(!guard.is_lost(), "lost: {:?}", guard.lost_signal().reason());
    }
    assert!(!waiter.is_finished());

    let top = [&x, &r, &s]
        .iter()
        .map(|g| g.fencing_token())
        .chain(m.fencing_tokens().iter().copied())
        .max()
        .unwrap();
    again
        .release()
        .await
        .expect("release one level after the restart");
    x.release().await.expect("release after the restart");
    let next = timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the queued waiter is granted")
        .unwrap()
        .unwrap();
    assert!(next.fencing_token() > top);
    for guard in [r, s, m, next] {
        guard.release().await.expect("release after the restart");
    }
}

/// Resumes and re-reads until the restarted server answers.
async fn eventually_describe(client: &Client, name: &str) -> locksmith::LockInfo {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match client.describe(name).await {
            Ok(Some(info)) => return info,
            other => {
                assert!(Instant::now() < deadline, "describe {name}: {other:?}");
                sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_and_queue_survive_kill_9() {
    holds_and_queue_survive(|server| {
        server.kill();
        server.restart();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_and_queue_survive_graceful_restart() {
    holds_and_queue_survive(|server| {
        server.stop();
        assert!(
            server.data_dir().join("snapshot").exists(),
            "a graceful stop writes a snapshot"
        );
        server.restart();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_never_resumes_expires_after_the_grace_period() {
    let server = ServerProcess::start_with(&["--grace", "2s"]);
    let name = unique("grace");
    let mut ghost = RawSession::open(server.port(), 500).await;
    let granted = ghost.acquire(1, &name, pb::WaitKind::No).await;
    let ghost_token = match granted {
        pb::reply::Result::Granted(g) => g.tokens[0],
        other => panic!("{other:?}"),
    };
    drop(ghost);
    server.kill();
    // Counted from before the restart, whose grace period starts with it,
    // so that the bound holds however long the restart takes.
    let started = Instant::now();
    server.restart();
    let client = server.client(Duration::from_secs(5)).await;
    let guard = client
        .lock(name.as_str())
        .acquire_timeout(Duration::from_secs(20))
        .await
        .expect("the lock is freed once the grace period ends");
    assert!(guard.fencing_token() > ghost_token);
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "freed after {:?}, before the grace period",
        started.elapsed()
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_client_loses_its_holds_after_its_ttl() {
    let server = ServerProcess::start();
    let name = unique("silent");
    let mut silent = RawSession::open(server.port(), 600).await;
    let token = match silent.acquire(1, &name, pb::WaitKind::No).await {
        pb::reply::Result::Granted(g) => g.tokens[0],
        other => panic!("{other:?}"),
    };
    // It keeps its stream open but never heartbeats. Counted from here, its
    // last word, however long the next client takes to connect.
    let started = Instant::now();
    let client = server.client(Duration::from_secs(5)).await;
    let next = client
        .lock(name.as_str())
        .acquire_timeout(Duration::from_secs(10))
        .await
        .expect("granted once the silent session expires");
    assert!(next.fencing_token() > token);
    assert!(started.elapsed() >= Duration::from_millis(300));
    // The silent client is told, on its stream, before the stream ends.
    let mut saw_lost = false;
    loop {
        match silent.next().await {
            Some(pb::server_message::Kind::Lost(lost)) => {
                assert_eq!(lost.token, token);
                assert_eq!(lost.reason, pb::LostReason::SessionExpired as i32);
                saw_lost = true;
            }
            Some(pb::server_message::Kind::Ended(ended)) => {
                assert_eq!(ended.reason, "expired");
                break;
            }
            Some(_) => {}
            None => panic!("stream ended without an ended message"),
        }
    }
    assert!(saw_lost);
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_a_holding_process_frees_the_lock_after_its_ttl() {
    let server = ServerProcess::start();
    let name = unique("killed-holder");
    let mut child = Command::new(BINARY)
        .args([
            "hold",
            &name,
            "--backend",
            &server.url(),
            "--session-ttl",
            "1s",
        ])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start locksmith hold");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .expect("read the token");
    let held: u64 = line
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("token line {line:?}"));

    let client = server.client(Duration::from_secs(5)).await;
    assert!(client
        .lock(name.as_str())
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    child.kill().expect("kill -9");
    let _ = child.wait();
    let killed = Instant::now();
    let guard = client
        .lock(name.as_str())
        .acquire_timeout(Duration::from_secs(10))
        .await
        .expect("freed after the session TTL");
    let waited = killed.elapsed();
    assert!(guard.fencing_token() > held);
    assert!(
        waited >= Duration::from_millis(500) && waited < Duration::from_secs(5),
        "freed after {waited:?} (session TTL 1s)"
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_resumes_across_a_restart_and_keeps_working() {
    let server = ServerProcess::start();
    let client = server.client(Duration::from_secs(5)).await;
    let name = unique("resume");
    let guard: Guard = client.lock(name.as_str()).acquire().await.unwrap();
    server.kill();
    // While the server is down, a second acquire waits; it completes after
    // the restart, once the first hold is released.
    let second = tokio::spawn({
        let lock = client.lock(name.as_str());
        async move { lock.acquire().await }
    });
    sleep(Duration::from_millis(200)).await;
    server.restart();
    let info = eventually_describe(&client, &name).await;
    assert_eq!(info.holders[0].fencing_token, Some(guard.fencing_token()));
    eventually(
        Duration::from_secs(10),
        "the second acquire is queued again",
        || async {
            client
                .describe(&name)
                .await
                .is_ok_and(|i| i.is_some_and(|i| i.waiters.len() == 1))
        },
    )
    .await;
    let first = guard.fencing_token();
    guard.release().await.unwrap();
    let second = timeout(Duration::from_secs(10), second)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(second.fencing_token() > first);
    second.release().await.unwrap();
}
