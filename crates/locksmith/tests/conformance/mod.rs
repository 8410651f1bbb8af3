//! The conformance suite: the lock model's behaviour, written once, run
//! unchanged against every backend.
//!
//! A backend's test file provides a [`Harness`] and expands [`suite!`]:
//!
//! ```ignore
//! mod conformance;
//! conformance::suite!(#[tokio::test(start_paused = true)] memory_harness());
//! ```
//!
//! Every test uses lock names under its own unique prefix, so tests can share
//! one server. Time-based tests use `tokio::time`, so they run instantly under a
//! paused clock and in real time against real servers.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use locksmith::{Client, Error, LostCause, Mode};
use tokio::time::{sleep, timeout};

/// What a backend's test file provides.
pub trait Harness: Send + Sync + 'static {
    /// A new client whose session TTL (watchdog lease) is `session_ttl`.
    fn connect(&self, session_ttl: Duration) -> impl std::future::Future<Output = Client> + Send;

    /// The shortest lease / session TTL the backend handles reliably; time-based
    /// tests scale from it.
    fn short_ttl(&self) -> Duration;
}

/// Expands one test per behaviour, each with the given test attribute and
/// harness (an expression evaluating to a future of a [`Harness`]).
macro_rules! suite {
    (#[$attr:meta] $harness:expr) => {
        $crate::conformance::suite!(@each #[$attr] $harness;
            mutual_exclusion, try_acquire_on_held_lock, acquire_timeout,
            cancelled_acquire_leaves_nothing, stale_owner_cannot_release, reentry_keeps_token,
            tokens_increase_across_holders, lease_expiry_frees_lock, watchdog_keeps_hold_alive,
            lost_fires_when_hold_expires, fifo_order_of_ten_waiters, read_write_semantics,
            writer_fairness, semaphore_never_exceeds_permits, semaphore_permit_mismatch,
            multi_lock_never_deadlocks, multi_lock_is_all_or_nothing, invalid_names_rejected,
            invalid_options_rejected, dropping_guard_releases, inspection_shows_holder_and_waiters,
            election_fails_over
        );
    };
    (@each #[$attr:meta] $harness:expr; $($test:ident),* $(,)?) => {
        $(
            #[$attr]
            async fn $test() {
                let harness = $harness.await;
                $crate::conformance::$test(&harness).await;
            }
        )*
    };
}
pub(crate) use suite;

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A lock name no other test uses.
fn unique(test: &str) -> String {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let run = uuid::Uuid::new_v4().simple().to_string();
    format!("conformance/{}/{test}-{n}", &run[..8])
}

async fn client<H: Harness>(h: &H) -> Client {
    h.connect(Duration::from_secs(30)).await
}

/// Waits until `name` shows `count` waiters where the backend can list them,
/// otherwise gives the waiters a moment to queue.
async fn until_waiters(client: &Client, name: &str, count: usize) {
    if !client.backend().capabilities().lists_waiters {
        sleep(Duration::from_millis(300)).await;
        return;
    }
    for _ in 0..1000 {
        let info = client.describe(name).await.expect("describe");
        if info.is_some_and(|i| i.waiters.len() >= count) {
            return;
        }
        sleep(Duration::from_millis(10)).await;
    }
    panic!("{name}: never saw {count} waiters");
}

pub async fn mutual_exclusion<H: Harness>(h: &H) {
    let name = unique("mutex");
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicU64::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let client = client(h).await;
        let (name, counter, inside, tokens) = (
            name.clone(),
            counter.clone(),
            inside.clone(),
            tokens.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..3 {
                let guard = client.lock(name.as_str()).acquire().await.expect("acquire");
                assert_eq!(
                    inside.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two holders at once"
                );
                tokens.lock().unwrap().push(guard.fencing_token());
                // A non-atomic read-modify-write with a suspension in the middle.
                let value = counter.load(Ordering::SeqCst);
                tokio::task::yield_now().await;
                sleep(Duration::from_millis(1)).await;
                counter.store(value + 1, Ordering::SeqCst);
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.release().await.expect("release");
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    assert_eq!(counter.load(Ordering::SeqCst), 96);
    let tokens = tokens.lock().unwrap().clone();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens not increasing: {tokens:?}"
    );
}

pub async fn try_acquire_on_held_lock<H: Harness>(h: &H) {
    let (a, b) = (client(h).await, client(h).await);
    let name = unique("try");
    let guard = a
        .lock(name.as_str())
        .try_acquire()
        .await
        .unwrap()
        .expect("free lock");
    assert!(b.lock(name.as_str()).try_acquire().await.unwrap().is_none());
    assert!(
        a.lock(name.as_str()).try_acquire().await.unwrap().is_none(),
        "fresh owner is not a re-entry"
    );
    guard.release().await.unwrap();
    let again = b.lock(name.as_str()).try_acquire().await.unwrap();
    assert!(again.is_some());
}

pub async fn acquire_timeout<H: Harness>(h: &H) {
    let (a, b) = (client(h).await, client(h).await);
    let name = unique("timeout");
    let _held = a.lock(name.as_str()).acquire().await.unwrap();
    let wait = h.short_ttl();
    let started = tokio::time::Instant::now();
    match b.lock(name.as_str()).acquire_timeout(wait).await {
        Err(Error::Timeout(limit)) => assert_eq!(limit, wait),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(started.elapsed() >= wait);
    match b.lock(name.as_str()).wait(wait).acquire().await {
        Err(Error::Timeout(_)) => {}
        other => panic!("the wait option must time out too, got {other:?}"),
    }
}

pub async fn cancelled_acquire_leaves_nothing<H: Harness>(h: &H) {
    let (a, b, c) = (client(h).await, client(h).await, client(h).await);
    let name = unique("cancel");
    let held = a.lock(name.as_str()).acquire().await.unwrap();
    let waiter = tokio::spawn({
        let lock = b.lock(name.as_str());
        async move { lock.acquire().await }
    });
    until_waiters(&a, &name, 1).await;
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    if a.backend().capabilities().lists_waiters {
        // A dropped future cannot wait for its store: the cleanup it starts
        // (a cancelled statement behind a pooler, a deleted node or key)
        // finishes in the background, and must finish promptly.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let info = a.describe(&name).await.unwrap().expect("still held");
            if info.waiters.is_empty() {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "cancelled waiter left behind: {info:?}"
            );
            sleep(Duration::from_millis(10)).await;
        }
    }
    held.release().await.unwrap();
    let next = timeout(h.short_ttl() * 4, c.lock(name.as_str()).acquire()).await;
    assert!(next
        .expect("a cancelled waiter must not keep the lock")
        .is_ok());
}

pub async fn stale_owner_cannot_release<H: Harness>(h: &H) {
    let (a, b) = (client(h).await, client(h).await);
    let name = unique("stale");
    let ttl = h.short_ttl();
    let stale = a.lock(name.as_str()).lease(ttl).acquire().await.unwrap();
    let current = b
        .lock(name.as_str())
        .acquire_timeout(ttl * 10)
        .await
        .unwrap();
    assert!(current.fencing_token() > stale.fencing_token());
    assert!(
        stale.release().await.is_err(),
        "a former owner released the current owner's lock"
    );
    let info = b.describe(&name).await.unwrap().expect("still held");
    assert_eq!(info.holders.len(), 1);
    assert_eq!(
        info.holders[0]
            .fencing_token
            .unwrap_or(current.fencing_token()),
        current.fencing_token()
    );
    current.release().await.unwrap();
}

pub async fn reentry_keeps_token<H: Harness>(h: &H) {
    let (a, b) = (client(h).await, client(h).await);
    let name = unique("reentry");
    let first = a
        .lock(name.as_str())
        .owner("worker")
        .acquire()
        .await
        .unwrap();
    let second = a
        .lock(name.as_str())
        .owner("worker")
        .acquire()
        .await
        .unwrap();
    assert_eq!(first.fencing_token(), second.fencing_token());
    let info = a.describe(&name).await.unwrap().unwrap();
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.holders[0].hold_count, 2);
    match a
        .lock(name.as_str())
        .owner("worker")
        .reentrant(false)
        .try_acquire()
        .await
    {
        Err(Error::AlreadyHeld { .. }) => {}
        other => panic!("non-reentrant re-acquire must fail, got {other:?}"),
    }
    second.release().await.unwrap();
    assert!(
        !first.is_lost(),
        "releasing one re-entry level must not report the hold lost"
    );
    assert!(
        b.lock(name.as_str()).try_acquire().await.unwrap().is_none(),
        "one level still held"
    );
    first.release().await.unwrap();
    assert!(b.lock(name.as_str()).try_acquire().await.unwrap().is_some());
}

pub async fn tokens_increase_across_holders<H: Harness>(h: &H) {
    let (a, b) = (client(h).await, client(h).await);
    let name = unique("tokens");
    let mut last = 0;
    for round in 0..6 {
        let c = if round % 2 == 0 { &a } else { &b };
        let guard = c.lock(name.as_str()).acquire().await.unwrap();
        assert!(
            guard.fencing_token() > last,
            "token {} after {last}",
            guard.fencing_token()
        );
        last = guard.fencing_token();
        guard.release().await.unwrap();
    }
}

pub async fn lease_expiry_frees_lock<H: Harness>(h: &H) {
    let (a, b) = (client(h).await, client(h).await);
    let name = unique("lease");
    let ttl = h.short_ttl();
    let first = a.lock(name.as_str()).lease(ttl).acquire().await.unwrap();
    let second = b
        .lock(name.as_str())
        .acquire_timeout(ttl * 10)
        .await
        .expect("lease must end");
    assert!(second.fencing_token() > first.fencing_token());
    assert!(first.is_lost() || timeout(ttl * 2, first.lost()).await.is_ok());
    second.release().await.unwrap();
}

pub async fn watchdog_keeps_hold_alive<H: Harness>(h: &H) {
    let ttl = h.short_ttl();
    let a = h.connect(ttl).await;
    let b = client(h).await;
    let name = unique("watchdog");
    let guard = a.lock(name.as_str()).acquire().await.unwrap();
    sleep(ttl * 5).await;
    assert!(!guard.is_lost(), "lost: {:?}", guard.lost_signal().reason());
    assert!(b.lock(name.as_str()).try_acquire().await.unwrap().is_none());
    guard
        .release()
        .await
        .expect("still ours after five lease periods");
}

pub async fn lost_fires_when_hold_expires<H: Harness>(h: &H) {
    let a = client(h).await;
    let name = unique("lost");
    let ttl = h.short_ttl();
    let guard = a.lock(name.as_str()).lease(ttl).acquire().await.unwrap();
    let reason = timeout(ttl * 10, guard.lost())
        .await
        .expect("lost() must fire");
    assert!(!reason.is_empty());
    assert!(guard.is_lost());
    assert_eq!(
        guard.lost_signal().cause(),
        Some(LostCause::LeaseExpired),
        "{reason}"
    );
    assert!(matches!(guard.release().await, Err(Error::Lost(_))));
}

pub async fn fifo_order_of_ten_waiters<H: Harness>(h: &H) {
    let a = client(h).await;
    if !a.backend().capabilities().fifo {
        return;
    }
    let name = unique("fifo");
    let held = a.lock(name.as_str()).acquire().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..10 {
        let c = client(h).await;
        let (lock, order) = (c.lock(name.as_str()), order.clone());
        tasks.push(tokio::spawn(async move {
            let guard = lock.acquire().await.unwrap();
            order.lock().unwrap().push(i);
            guard.release().await.unwrap();
        }));
        until_waiters(&a, &name, i + 1).await;
    }
    held.release().await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..10).collect::<Vec<_>>());
}

pub async fn read_write_semantics<H: Harness>(h: &H) {
    let (a, b, c) = (client(h).await, client(h).await, client(h).await);
    if !a.backend().capabilities().shared {
        return;
    }
    let name = unique("rw");
    let r1 = a
        .rw_lock(name.as_str())
        .read()
        .try_acquire()
        .await
        .unwrap()
        .expect("reader");
    let r2 = b
        .rw_lock(name.as_str())
        .read()
        .try_acquire()
        .await
        .unwrap()
        .expect("readers share");
    assert!(c
        .rw_lock(name.as_str())
        .write()
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    let reader_tokens = r1.fencing_token().max(r2.fencing_token());
    r1.release().await.unwrap();
    assert!(c
        .rw_lock(name.as_str())
        .write()
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    r2.release().await.unwrap();
    let w = c
        .rw_lock(name.as_str())
        .write()
        .try_acquire()
        .await
        .unwrap()
        .expect("writer");
    assert!(a
        .rw_lock(name.as_str())
        .read()
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    assert!(b
        .rw_lock(name.as_str())
        .write()
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    assert!(w.fencing_token() > reader_tokens);
    w.release().await.unwrap();
}

pub async fn writer_fairness<H: Harness>(h: &H) {
    let (a, b, c) = (client(h).await, client(h).await, client(h).await);
    let caps = a.backend().capabilities();
    if !caps.shared || !caps.fifo {
        return;
    }
    let name = unique("fair");
    let reader = a.rw_lock(name.as_str()).read().acquire().await.unwrap();
    let writer = tokio::spawn({
        let lock = b.rw_lock(name.as_str()).write();
        async move { lock.acquire().await }
    });
    until_waiters(&a, &name, 1).await;
    // A reader arriving after a waiting writer must queue behind it.
    assert!(c
        .rw_lock(name.as_str())
        .read()
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    reader.release().await.unwrap();
    let writer = writer.await.unwrap().expect("writer gets the lock");
    writer.release().await.unwrap();
}

pub async fn semaphore_never_exceeds_permits<H: Harness>(h: &H) {
    let a = client(h).await;
    if !a.backend().capabilities().semaphore {
        return;
    }
    let name = unique("sem");
    let inside = Arc::new(AtomicU64::new(0));
    let peak = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let c = client(h).await;
        let (name, inside, peak) = (name.clone(), inside.clone(), peak.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..2 {
                let permit = c.semaphore(name.as_str(), 3).acquire().await.unwrap();
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                sleep(Duration::from_millis(20)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                permit.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let peak = peak.load(Ordering::SeqCst);
    assert!(peak <= 3, "{peak} holders of a 3-permit semaphore");
    assert!(peak >= 2, "permits were never shared (peak {peak})");
}

pub async fn semaphore_permit_mismatch<H: Harness>(h: &H) {
    let (a, b) = (client(h).await, client(h).await);
    if !a.backend().capabilities().semaphore {
        return;
    }
    let name = unique("sem-mismatch");
    let permit = a.semaphore(name.as_str(), 2).acquire().await.unwrap();
    match b.semaphore(name.as_str(), 5).try_acquire().await {
        Err(Error::Conflict {
            mode: Mode::Semaphore { permits: 5 },
            ..
        }) => {}
        other => panic!("permit mismatch must be a conflict, got {other:?}"),
    }
    permit.release().await.unwrap();
}

pub async fn multi_lock_never_deadlocks<H: Harness>(h: &H) {
    let (a, b) = (client(h).await, client(h).await);
    let (x, y) = (unique("multi-a"), unique("multi-b"));
    let run = |c: Client, names: [String; 2]| async move {
        for _ in 0..10 {
            let guard = c.multi_lock(names.clone()).acquire().await.unwrap();
            assert_eq!(guard.fencing_tokens().len(), 2);
            sleep(Duration::from_millis(2)).await;
            guard.release().await.unwrap();
        }
    };
    let both = async {
        tokio::join!(
            tokio::spawn(run(a, [x.clone(), y.clone()])),
            tokio::spawn(run(b, [y.clone(), x.clone()]))
        )
    };
    let (r1, r2) = timeout(Duration::from_secs(60), both)
        .await
        .expect("multi-locks deadlocked");
    r1.unwrap();
    r2.unwrap();
}

pub async fn multi_lock_is_all_or_nothing<H: Harness>(h: &H) {
    let (a, b) = (client(h).await, client(h).await);
    let (x, y) = (unique("aon-a"), unique("aon-b"));
    let held = a.lock(y.as_str()).acquire().await.unwrap();
    assert!(b
        .multi_lock([x.as_str(), y.as_str()])
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    // Nothing of the failed multi-lock may stay held.
    let free = a.lock(x.as_str()).try_acquire().await.unwrap();
    assert!(free.is_some(), "{x} left held by a failed multi-lock");
    drop(free);
    held.release().await.unwrap();
    let both = b
        .multi_lock([x.as_str(), y.as_str()])
        .acquire_timeout(h.short_ttl() * 10)
        .await
        .unwrap();
    assert_eq!(both.names(), [x, y]);
    both.release().await.unwrap();
}

pub async fn invalid_names_rejected<H: Harness>(h: &H) {
    let a = client(h).await;
    let long = "x".repeat(513);
    for bad in [
        "",
        "/leading",
        "trailing/",
        "dou//ble",
        "nul\0byte",
        long.as_str(),
    ] {
        assert!(
            matches!(
                a.lock(bad).try_acquire().await,
                Err(Error::InvalidName { .. })
            ),
            "{bad:?} accepted"
        );
        assert!(matches!(
            a.describe(bad).await,
            Err(Error::InvalidName { .. })
        ));
    }
    let good = unique("valid");
    assert!(matches!(
        a.multi_lock([good.as_str(), "a//b"]).try_acquire().await,
        Err(Error::InvalidName { .. })
    ));
    assert!(
        a.describe(&good).await.unwrap().is_none(),
        "a rejected multi-lock must change nothing"
    );
}

pub async fn invalid_options_rejected<H: Harness>(h: &H) {
    let a = client(h).await;
    let name = unique("options");
    let lock = a.lock(name.as_str());
    for bad in [
        lock.clone().lease(Duration::ZERO),
        lock.clone().lease(Duration::from_secs(365 * 24 * 3600)),
        lock.clone().lock_delay(Duration::from_secs(61)),
        lock.clone().owner(""),
        a.semaphore(name.as_str(), 0),
        a.multi_lock([name.as_str(), name.as_str()]),
    ] {
        assert!(
            matches!(bad.try_acquire().await, Err(Error::InvalidArgument(_))),
            "{:?}",
            bad.options()
        );
    }
    assert!(a.describe(&name).await.unwrap().is_none());
}

pub async fn dropping_guard_releases<H: Harness>(h: &H) {
    let (a, b) = (client(h).await, client(h).await);
    let name = unique("drop");
    let guard = a.lock(name.as_str()).acquire().await.unwrap();
    drop(guard);
    let next = b
        .lock(name.as_str())
        .acquire_timeout(h.short_ttl() * 4)
        .await;
    assert!(next.is_ok(), "drop did not release: {next:?}");
}

pub async fn inspection_shows_holder_and_waiters<H: Harness>(h: &H) {
    let (a, b) = (client(h).await, client(h).await);
    let name = unique("inspect");
    assert!(a.describe(&name).await.unwrap().is_none());
    let guard = a
        .lock(name.as_str())
        .owner("inspector")
        .acquire()
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let lock = b.lock(name.as_str()).owner("patient");
        async move { lock.acquire().await }
    });
    until_waiters(&a, &name, 1).await;
    let info = b
        .describe(&name)
        .await
        .unwrap()
        .expect("held lock is described");
    assert_eq!(info.name, name);
    assert_eq!(info.holders.len(), 1);
    let holder = &info.holders[0];
    assert_eq!(holder.owner, "inspector");
    assert_eq!(holder.mode, Mode::Exclusive);
    assert_eq!(holder.hold_count, 1);
    if let Some(token) = holder.fencing_token {
        assert_eq!(token, guard.fencing_token());
    }
    if a.backend().capabilities().lists_waiters {
        assert_eq!(info.waiters.len(), 1);
        assert_eq!(info.waiters[0].owner, "patient");
        assert!(holder.lock_by.is_some());
        assert!(holder.lock_time.is_some());
    }
    let listed = a.list(&name).await.unwrap();
    assert_eq!(
        listed.iter().map(|i| i.name.as_str()).collect::<Vec<_>>(),
        [name.as_str()]
    );
    guard.release().await.unwrap();
    waiter.await.unwrap().unwrap().release().await.unwrap();
}

pub async fn election_fails_over<H: Harness>(h: &H) {
    let (a, b, observer) = (client(h).await, client(h).await, client(h).await);
    let name = unique("election");
    assert_eq!(
        observer.election(name.as_str()).leader().await.unwrap(),
        None
    );
    let first = a.election(name.as_str()).campaign("node-1").await.unwrap();
    let second = tokio::spawn({
        let election = b.election(name.as_str());
        async move { election.campaign("node-2").await }
    });
    until_waiters(&a, &name, 1).await;
    let leader = observer
        .election(name.as_str())
        .leader()
        .await
        .unwrap()
        .expect("a leader");
    assert_eq!(leader.value, "node-1");
    first.release().await.unwrap();
    let second = timeout(h.short_ttl() * 10, second)
        .await
        .expect("failover")
        .unwrap()
        .unwrap();
    assert!(second.fencing_token() > 0);
    let leader = observer
        .election(name.as_str())
        .leader()
        .await
        .unwrap()
        .expect("a leader");
    assert_eq!(leader.value, "node-2");
    second.release().await.unwrap();
}
