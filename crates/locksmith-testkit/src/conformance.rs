//! The conformance suite: the lock model's behaviour, written once, run
//! unchanged against every backend (cargo feature `conformance`).
//!
//! A backend, in this repository or outside it, implements [`Harness`] (how
//! to connect a client; which faults it can inject) and expands
//! [`conformance_suite!`](crate::conformance_suite) in an integration test,
//! which writes one test, `conformance`, that runs every behaviour against
//! the harness ([`run_suite`]):
//!
//! ```ignore
//! // tests/conformance.rs of a crate with a backend `mystore://`, with
//! // `locksmith-testkit = { version = "0.1", features = ["conformance"] }`
//! // among its dev-dependencies.
//! use std::time::Duration;
//! use locksmith::{Client, ConnectOptions};
//! use locksmith_testkit::conformance::Harness;
//!
//! struct MyStore;
//!
//! impl Harness for MyStore {
//!     async fn connect(&self, session_ttl: Duration) -> Client {
//!         let backend = my_backend::connect("mystore://127.0.0.1:4000", session_ttl).await.unwrap();
//!         Client::from_backend(std::sync::Arc::new(backend))
//!     }
//!
//!     fn short_ttl(&self) -> Duration {
//!         Duration::from_secs(1)
//!     }
//! }
//!
//! locksmith_testkit::conformance_suite!(#[tokio::test(flavor = "multi_thread")] async { MyStore });
//! ```
//!
//! # One store, every behaviour at once
//!
//! The harness expression is a future, awaited once: the store it starts
//! (or reaches) serves every behaviour. The behaviours run concurrently,
//! each as a task of its own, on clients of their own and lock names under a
//! unique prefix of their own, so they do not see each other; a run takes
//! about as long as its slowest behaviour. Each behaviour is reported by
//! name on stderr, `ok` with its time or `FAILED` with its panic message,
//! and the test fails listing the behaviours that failed.
//!
//! To run behaviours alone, one after another, name them (comma separated)
//! in the environment variable `LOCKSMITH_CONFORMANCE`:
//!
//! ```sh
//! LOCKSMITH_CONFORMANCE=watchdog_keeps_hold_alive,extend_moves_a_lease \
//!     cargo nextest run -p locksmith --all-features -E 'test(/conformance/)'
//! ```
//!
//! Time-based behaviours use `tokio::time`, so they run instantly under a
//! paused clock and in real time against real servers, scaled from the
//! harness's [`Harness::short_ttl`].
//!
//! # Faults
//!
//! Force-release needs nothing of the harness ([`Client::force_release`]).
//! The other faults are the harness's to inject, into one client's session
//! or connection only (behaviours share servers): [`Harness::expire_session`] and
//! [`Harness::cut_connection`]. Each answers a [`Fault`]: the causes the
//! holds of that client must be lost with, or [`Fault::Unsupported`] (the
//! default), in which case the test says on stderr that it was skipped, for
//! which fault and harness, instead of passing silently. [`Clients`] finds,
//! for a client the suite hands to a hook, what the harness kept about it when
//! it connected it (the concrete backend, a connection's name).
//!
//! [`UrlHarness`] connects to one URL and injects no faults;
//! `ServerHarness` (feature `conformance-server`) is the lock server's,
//! which ends sessions through the admin API.
//!
//! # Cancel safety
//!
//! The suite's functions are tests: a behaviour dropped midway (a failed
//! assertion elsewhere, a timeout) leaves its holds to end with its clients'
//! sessions and leases, under its own unique prefix, so other behaviours are
//! not disturbed. A cut connection is restored only by
//! [`Harness::restore_connection`]: a test dropped between the two leaves
//! that one client cut off, and nothing else.

use std::any::type_name;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

mod counting;
#[cfg(feature = "conformance-server")]
mod server;
#[cfg(feature = "conformance-server")]
pub use server::ServerHarness;

use locksmith::backend::Backend;
use locksmith::{Client, ConnectOptions, Error, Guard, LostCause, Mode};
use tokio::time::{sleep, timeout, Instant};

/// The short session TTL for a store that syncs its writes to a disk.
///
/// A whole test run keeps this machine's one disk busy, and a renewal that
/// waits on a sync can take a third of a second. With 1 s sessions, renewing
/// every third of the TTL, a renewal came too late more than once: through
/// Redis with `appendfsync always`, through PostgreSQL behind a pooler, and
/// through the Raft cluster, whose every heartbeat is a commit. 2 s leaves a
/// renewal two thirds of a second and its retry as long again.
pub const DISK_SHORT_TTL: Duration = Duration::from_secs(2);

/// What a backend's test provides: clients, and the faults it can inject.
pub trait Harness: Send + Sync + 'static {
    /// A new client whose session TTL (watchdog lease) is `session_ttl`.
    fn connect(&self, session_ttl: Duration) -> impl Future<Output = Client> + Send;

    /// The shortest lease / session TTL the backend handles reliably; time-based
    /// tests scale from it.
    fn short_ttl(&self) -> Duration;

    /// The causes a holder's lost signal may give when an administrator
    /// force-releases its lock: [`LostCause::ForceReleased`] where the store
    /// says so, otherwise what the backend can tell (a key that is
    /// [`LostCause::Gone`], a connection the server ended).
    fn force_release_causes(&self) -> &'static [LostCause] {
        &[LostCause::ForceReleased]
    }

    /// How many behaviours may run at once against this harness: all of
    /// them by default. A harness whose clients cost much to connect says
    /// fewer (a Redis Cluster over TLS, whose every client makes a TLS
    /// handshake with every node).
    fn concurrency(&self) -> usize {
        usize::MAX
    }

    /// Ends `client`'s session on the store's side, as its expiry would (a
    /// closed ZooKeeper session, a revoked etcd lease, a terminated
    /// PostgreSQL backend), so its session holds are lost and others can
    /// take them.
    fn expire_session(&self, client: &Client) -> impl Future<Output = Fault> + Send {
        let _ = client;
        async { Fault::Unsupported }
    }

    /// Cuts `client` off the store, connections left open but silent (a
    /// stopped server process, a partition without resets), until
    /// [`restore_connection`](Harness::restore_connection). The client must
    /// report its holds lost before the store could grant them elsewhere.
    fn cut_connection(&self, client: &Client) -> impl Future<Output = Fault> + Send {
        let _ = client;
        async { Fault::Unsupported }
    }

    /// Undoes [`cut_connection`](Harness::cut_connection).
    ///
    /// Cancel safety of the three hooks: a hook dropped midway may or may
    /// not have injected its fault; it touches only the client it was given,
    /// and `restore_connection` undoes a cut either way.
    fn restore_connection(&self, client: &Client) -> impl Future<Output = ()> + Send {
        let _ = client;
        async {}
    }
}

/// What a harness did when asked for a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Fault {
    /// The fault is in place; the client's holds are to be lost with one of
    /// these causes (more than one where the backend may learn of the fault
    /// either way, e.g. a session's end or its node's deletion first).
    Injected(&'static [LostCause]),
    /// This harness cannot inject the fault: the test is skipped, saying so.
    Unsupported,
}

/// What a harness keeps about each client it connected, found again from
/// the client the suite hands to a fault hook. Entries die with their
/// client's backend.
pub struct Clients<T> {
    entries: Mutex<Vec<(Weak<dyn Backend>, T)>>,
}

impl<T> Default for Clients<T> {
    fn default() -> Self {
        Clients {
            entries: Mutex::new(Vec::new()),
        }
    }
}

impl<T: Clone> Clients<T> {
    /// Keeps `value` for `client`.
    pub fn remember(&self, client: &Client, value: T) {
        let mut entries = self.entries.lock().expect("clients");
        entries.retain(|(backend, _)| backend.strong_count() > 0);
        entries.push((Arc::downgrade(client.backend()), value));
    }

    /// What was kept for `client`. Panics if nothing was: the client did not
    /// come from this harness.
    pub fn of(&self, client: &Client) -> T {
        let backend = Arc::as_ptr(client.backend()).cast::<()>();
        self.entries
            .lock()
            .expect("clients")
            .iter()
            .find(|(b, _)| b.as_ptr().cast::<()>() == backend)
            .map(|(_, value)| value.clone())
            .expect("a client connected by this harness")
    }
}

/// Declares the list of behaviours once, for [`BEHAVIOURS`] and
/// [`run_suite`]: expands `$crate::$then! { $($args)* ; behaviour, … }`.
///
/// The behaviours that wait longest on real time come first, so that a run
/// whose concurrency is bounded starts them at once.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_behaviours {
    ($then:ident { $($args:tt)* }) => {
        $crate::$then! { $($args)* ;
            extend_moves_a_lease, watchdog_keeps_hold_alive, lock_delay_holds_the_lock_back,
            force_release_fires_lost, expired_session_fires_lost_and_hands_over,
            multi_lock_is_lost_with_any_part, cut_connection_fires_lost_before_handover,
            mutual_exclusion, multi_lock_never_deadlocks, acquire_timeout,
            lease_expiry_frees_lock, lost_fires_when_hold_expires, stale_owner_cannot_release,
            try_acquire_on_held_lock, cancelled_acquire_leaves_nothing, reentry_keeps_token,
            tokens_increase_across_holders, fifo_order_of_ten_waiters, read_write_semantics,
            writer_fairness, semaphore_never_exceeds_permits, semaphore_permit_mismatch,
            multi_lock_is_all_or_nothing, invalid_names_rejected, invalid_options_rejected,
            dropping_guard_releases, inspection_shows_holder_and_waiters, election_fails_over,
            election_is_observed, proclaim_after_loss_fails,
            racing_acquires_of_one_owner_share_the_grant, waiting_owner_is_busy_to_itself,
            guard_tells_count_and_lease, reentry_reaches_the_store_once,
            close_releases_everything
        }
    };
}

/// Expands one test, `conformance`, that runs every behaviour of the suite
/// ([`run_suite`](crate::conformance::run_suite)) against one harness, with
/// the given test attribute; the harness is an expression evaluating to a
/// future of a [`Harness`](crate::conformance::Harness), awaited once:
///
/// ```ignore
/// locksmith_testkit::conformance_suite!(#[tokio::test(start_paused = true)] memory_harness());
/// ```
///
/// Expand it in a module of its own to run the suite against several
/// harnesses in one crate.
#[macro_export]
macro_rules! conformance_suite {
    (#[$attr:meta] $harness:expr) => {
        #[$attr]
        async fn conformance() {
            $crate::conformance::run_suite($harness.await).await;
        }
    };
}

/// One behaviour of the suite, for harness `H`.
struct Behaviour<H> {
    name: &'static str,
    run: fn(Arc<H>) -> futures::future::BoxFuture<'static, ()>,
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_table {
    (; $($test:ident),* $(,)?) => {
        /// The names of the suite's behaviours, in the order
        /// [`run_suite`] starts them.
        pub const BEHAVIOURS: &[&str] = &[$(stringify!($test)),*];

        /// Every behaviour, for harness `H`.
        fn behaviours<H: Harness>() -> Vec<Behaviour<H>> {
            vec![$(
                Behaviour {
                    name: stringify!($test),
                    run: |h| Box::pin(async move { $test(&*h).await }),
                }
            ),*]
        }
    };
}
crate::__conformance_behaviours!(__conformance_table {});

/// The environment variable that picks behaviours to run alone: names of
/// [`BEHAVIOURS`], separated by commas.
pub const ONLY_VAR: &str = "LOCKSMITH_CONFORMANCE";

/// How long one behaviour may take before it counts as failed. The slowest
/// take about ten short TTLs; a behaviour stuck past this is reported by
/// name rather than hanging the run.
const BEHAVIOUR_LIMIT: Duration = Duration::from_secs(300);

/// Runs the suite's behaviours against `harness`: all of them, concurrently
/// (each on its own lock names and its own clients, so they share the
/// harness's store), or those named in `LOCKSMITH_CONFORMANCE` (comma
/// separated), one after another. Prints each behaviour's name with `ok` or
/// `FAILED` and its panic message on stderr, and panics listing the failed
/// ones.
///
/// ```sh
/// LOCKSMITH_CONFORMANCE=watchdog_keeps_hold_alive cargo nextest run -p locksmith --all-features -E 'test(/conformance/)'
/// ```
///
/// Cancel safety: a run dropped midway leaves the behaviours it started
/// running as detached tasks until their runtime stops; each leaves its
/// holds to end with its clients, as a dropped behaviour does.
pub async fn run_suite<H: Harness>(harness: H) {
    let harness = Arc::new(harness);
    let (selected, concurrency) = match std::env::var(ONLY_VAR) {
        Ok(only) if !only.trim().is_empty() => (only_these::<H>(&only), 1),
        _ => (behaviours::<H>(), harness.concurrency()),
    };
    let concurrency = concurrency.clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
    let slots = Arc::new(tokio::sync::Semaphore::new(concurrency));
    let total = selected.len();
    let mut running = Vec::with_capacity(total);
    for behaviour in selected {
        let (harness, slots) = (harness.clone(), slots.clone());
        let run = tokio::spawn(async move {
            let _slot = slots.acquire_owned().await.expect("never closed");
            let started = Instant::now();
            let finished = timeout(BEHAVIOUR_LIMIT, (behaviour.run)(harness)).await;
            (finished.is_ok(), started.elapsed())
        });
        running.push((behaviour.name, run));
    }
    let harness_name = type_name::<H>();
    let mut failed = Vec::new();
    for (name, run) in running {
        let outcome = match run.await {
            Ok((true, took)) => Ok(took),
            Ok((false, _)) => Err(format!("did not finish within {BEHAVIOUR_LIMIT:?}")),
            Err(error) => Err(match error.try_into_panic() {
                Ok(payload) => panic_message(payload.as_ref()),
                Err(error) => error.to_string(),
            }),
        };
        match outcome {
            Ok(took) => eprintln!("conformance {harness_name}: {name} ok ({took:.1?})"),
            Err(message) => {
                eprintln!("conformance {harness_name}: {name} FAILED: {message}");
                failed.push(name);
            }
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {total} behaviours failed on {harness_name}: {}",
        failed.len(),
        failed.join(", ")
    );
}

/// The behaviours named in `only` (comma separated). Panics naming the
/// suite's behaviours if one is unknown.
fn only_these<H: Harness>(only: &str) -> Vec<Behaviour<H>> {
    let names: Vec<&str> = only.split(',').map(str::trim).collect();
    if let Some(unknown) = names.iter().find(|n| !BEHAVIOURS.contains(n)) {
        panic!(
            "{ONLY_VAR}: no behaviour {unknown:?}; the suite's are: {}",
            BEHAVIOURS.join(", ")
        );
    }
    behaviours::<H>()
        .into_iter()
        .filter(|b| names.contains(&b.name))
        .collect()
}

/// The text of a panic's payload.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

/// Says on stderr that `test` is skipped because harness `H` cannot inject
/// `fault`.
fn skipped<H: Harness>(test: &str, fault: &str) {
    eprintln!(
        "conformance: {test} SKIPPED: {} cannot {fault}",
        type_name::<H>()
    );
}

/// Asserts that `guard` was lost with one of `causes`.
fn assert_lost_with(guard: &Guard, causes: &[LostCause], reason: &str) {
    let cause = guard.lost_signal().cause();
    assert!(
        cause.is_some_and(|c| causes.contains(&c)),
        "lost with {cause:?} ({reason}), expected one of {causes:?}"
    );
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A lock name no other test uses.
fn unique(test: &str) -> String {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let run = uuid::Uuid::new_v4().simple().to_string();
    format!("conformance/{}/{test}-{n}", &run[..8])
}

/// A client with a 30 s session TTL.
///
/// Cancel safety: as the harness's `connect`.
async fn client<H: Harness>(h: &H) -> Client {
    h.connect(Duration::from_secs(30)).await
}

/// Waits until `name` shows `count` waiters where the backend can list them,
/// otherwise gives the waiters a moment to queue.
///
/// Cancel safety: safe, read-only.
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

/// Many clients taking turns never hold one lock at once, and tokens grow.
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

/// `try_acquire` of a held lock answers `None`, for other clients and fresh owners alike.
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

/// An acquire that waits longer than its limit is `Error::Timeout`.
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

/// A dropped acquire leaves no waiter behind.
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

/// A holder whose lease ended cannot release its successor's hold.
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

/// Re-entry by one owner keeps the token and counts levels.
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

/// Each new holder gets a higher fencing token.
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

/// A hold whose lease ends frees the lock for the next, with a higher token.
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

/// A session hold outlives several session TTLs while its client is alive.
///
/// Its hold lives longer than any other test's, so its TTL is twice the
/// short one: a store that stalls on a busy disk for more than a renewal's
/// share of a short TTL rightly costs a hold its session, and this test is
/// about renewal, not about stalls. Seven renewals in two and a half TTLs
/// still show that renewal, not a long first lease, keeps it.
pub async fn watchdog_keeps_hold_alive<H: Harness>(h: &H) {
    let ttl = h.short_ttl() * 2;
    let a = h.connect(ttl).await;
    let b = client(h).await;
    let name = unique("watchdog");
    let guard = a.lock(name.as_str()).acquire().await.unwrap();
    sleep(ttl * 5 / 2).await;
    assert!(!guard.is_lost(), "lost: {:?}", guard.lost_signal().reason());
    assert!(b.lock(name.as_str()).try_acquire().await.unwrap().is_none());
    guard
        .release()
        .await
        .expect("still ours after two and a half lease periods");
}

/// A leased hold that ends fires lost with `LostCause::LeaseExpired`.
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

/// Where the backend is FIFO, waiters are granted in arrival order.
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

/// A read (shared) hold of `name` if one is free now.
///
/// Cancel safety: safe, as `Lock::try_acquire`.
async fn try_read(client: &Client, name: &str) -> Option<Guard> {
    client.rw_lock(name).read().try_acquire().await.unwrap()
}

/// A write (exclusive) hold of `name` if one is free now.
///
/// Cancel safety: safe, as `Lock::try_acquire`.
async fn try_write(client: &Client, name: &str) -> Option<Guard> {
    client.rw_lock(name).write().try_acquire().await.unwrap()
}

/// Readers share, writers exclude readers and writers.
pub async fn read_write_semantics<H: Harness>(h: &H) {
    let (a, b, c) = (client(h).await, client(h).await, client(h).await);
    if !a.backend().capabilities().shared {
        return;
    }
    let name = unique("rw");
    let r1 = try_read(&a, &name).await.expect("reader");
    let r2 = try_read(&b, &name).await.expect("readers share");
    assert!(try_write(&c, &name).await.is_none());
    let reader_tokens = r1.fencing_token().max(r2.fencing_token());
    r1.release().await.unwrap();
    assert!(try_write(&c, &name).await.is_none());
    r2.release().await.unwrap();
    let w = try_write(&c, &name).await.expect("writer");
    assert!(try_read(&a, &name).await.is_none());
    assert!(try_write(&b, &name).await.is_none());
    assert!(w.fencing_token() > reader_tokens);
    w.release().await.unwrap();
}

/// A reader arriving after a waiting writer queues behind it (FIFO backends).
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
    assert!(try_read(&c, &name).await.is_none());
    reader.release().await.unwrap();
    let writer = writer.await.unwrap().expect("writer gets the lock");
    writer.release().await.unwrap();
}

/// A semaphore never has more holders than permits, and does let as many
/// hold at once as it has permits.
pub async fn semaphore_never_exceeds_permits<H: Harness>(h: &H) {
    let a = client(h).await;
    if !a.backend().capabilities().semaphore {
        return;
    }
    let name = unique("sem");
    // Every client connects first, so that the ten contend at once however
    // long a connection takes (a TLS cluster: a handshake per node).
    let mut clients = Vec::new();
    for _ in 0..10 {
        clients.push(client(h).await);
    }

    // Shared: three holders of a 3-permit semaphore at once. Each stays
    // until all three are in, so this does not depend on acquisitions
    // overlapping by luck of timing (a store whose grants come slower than
    // a short hold would otherwise never show two at once).
    let all_in = Arc::new(tokio::sync::Barrier::new(3));
    let sharing = clients[..3].iter().map(|c| {
        let (permit, all_in) = (c.semaphore(name.as_str(), 3), all_in.clone());
        async move {
            let permit = permit.acquire().await.unwrap();
            all_in.wait().await;
            permit.release().await.unwrap();
        }
    });
    timeout(Duration::from_secs(30), futures::future::join_all(sharing))
        .await
        .expect("permits were never shared: three holders of 3 permits never held at once");

    // Bounded: ten clients contending never make more than three holders.
    let inside = Arc::new(AtomicU64::new(0));
    let peak = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for c in clients {
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
}

/// Disagreeing on a semaphore's permits is `Error::Conflict`.
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

/// Multi-locks over the same names in opposite orders do not deadlock.
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

/// A multi-lock that cannot take every lock holds none.
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

/// Malformed names are `Error::InvalidName` and change nothing.
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

/// Out-of-range options are `Error::InvalidArgument` and change nothing.
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

/// Dropping a guard releases its hold.
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

/// `describe` and `list` show holder, mode, count and waiters.
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

/// A resigned leader is followed by the next candidate.
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
    first.resign().await.unwrap();
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
    second.resign().await.unwrap();
}

/// The next item of an election's observe stream, within `limit`.
///
/// Cancel safety: safe; the observer stays consistent, as for a dropped
/// `next()` of its stream.
async fn next<S>(changes: &mut S, limit: Duration) -> Option<locksmith::Leader>
where
    S: futures::Stream<Item = locksmith::Result<Option<locksmith::Leader>>> + Unpin,
{
    use futures::StreamExt;
    timeout(limit, changes.next())
        .await
        .expect("a change in time")
        .expect("the stream goes on")
        .expect("observing works")
}

/// Observers see every leader, proclaimed value and vacancy.
pub async fn election_is_observed<H: Harness>(h: &H) {
    let (a, b, observer) = (client(h).await, client(h).await, client(h).await);
    let name = unique("observed");
    let election = a.election(name.as_str());
    let mut changes = Box::pin(observer.election(name.as_str()).observe());
    let limit = h.short_ttl() * 20;
    assert_eq!(next(&mut changes, limit).await, None, "nobody leads yet");

    assert!(matches!(
        election.campaign("").await,
        Err(Error::InvalidArgument(_))
    ));
    // The observer waits before the campaign (the campaign's first step
    // gives way to it): the new leader must wake it, not only show on a read.
    let (mut first, seen) = tokio::join!(
        async {
            tokio::task::yield_now().await;
            election.campaign("node-1").await.unwrap()
        },
        next(&mut changes, limit)
    );
    let seen = seen.expect("a leader");
    assert_eq!(seen.value, "node-1");
    if let Some(token) = seen.fencing_token {
        assert_eq!(token, first.fencing_token());
    }
    assert!(matches!(
        first.proclaim("bad\0value").await,
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(first.value(), "node-1");
    if a.backend().capabilities().proclaim {
        first.proclaim("node-1 at new address").await.unwrap();
        let seen = next(&mut changes, limit).await.expect("a leader");
        assert_eq!(seen.value, "node-1 at new address");
        if let Some(token) = seen.fencing_token {
            assert_eq!(token, first.fencing_token(), "same term, same token");
        }
        assert_eq!(first.value(), "node-1 at new address");
    } else {
        assert!(matches!(
            first.proclaim("elsewhere").await,
            Err(Error::Unsupported { .. })
        ));
        assert_eq!(first.value(), "node-1");
    }

    let second = tokio::spawn({
        let election = b.election(name.as_str());
        async move { election.campaign("node-2").await }
    });
    until_waiters(&a, &name, 1).await;
    first.resign().await.unwrap();
    // The handover may show a moment without a leader.
    let seen = loop {
        if let Some(leader) = next(&mut changes, limit).await {
            break leader;
        }
    };
    assert_eq!(seen.value, "node-2");
    let second = timeout(limit, second)
        .await
        .expect("failover")
        .unwrap()
        .unwrap();
    if let Some(token) = seen.fencing_token {
        assert_eq!(token, second.fencing_token());
    }
    second.resign().await.unwrap();
    assert_eq!(
        next(&mut changes, limit).await,
        None,
        "the last leader resigned"
    );
}

/// A leader that lost its hold cannot proclaim.
pub async fn proclaim_after_loss_fails<H: Harness>(h: &H) {
    let (a, admin) = (client(h).await, client(h).await);
    if !a.backend().capabilities().proclaim {
        return;
    }
    let name = unique("proclaim-lost");
    let mut leadership = a.election(name.as_str()).campaign("v1").await.unwrap();
    admin.force_release(&name).await.unwrap();
    timeout(h.short_ttl() * 20, leadership.lost())
        .await
        .expect("lost() fires once the leader's hold is gone");
    assert!(matches!(
        leadership.proclaim("v2").await,
        Err(Error::Lost(_))
    ));
    assert_eq!(leadership.value(), "v1");
    assert_eq!(admin.election(name.as_str()).leader().await.unwrap(), None);
}

/// Re-entry is the client's to decide, on every store: however deep an
/// owner re-enters, the store sees one acquire and one release per hold,
/// and inspection shows the depth the client counts.
pub async fn reentry_reaches_the_store_once<H: Harness>(h: &H) {
    let connected = client(h).await;
    let store = Arc::new(counting::CountingBackend::new(connected.backend().clone()));
    let a = Client::from_backend(store.clone());
    let name = unique("reentry-once");
    let lock = a.lock(name.as_str()).owner("worker");
    let mut levels: Vec<Guard> = Vec::new();
    for depth in 1..=3 {
        levels.push(lock.acquire().await.unwrap());
        let info = a.describe(&name).await.unwrap().unwrap();
        assert_eq!(info.holders.len(), 1, "{info:?}");
        assert_eq!(info.holders[0].hold_count, depth, "{info:?}");
    }
    assert_eq!(store.acquires(), 1, "the store saw every re-entry");
    let token = levels[0].fencing_token();
    assert!(levels.iter().all(|l| l.fencing_token() == token));
    for depth in (1..=2).rev() {
        levels.pop().unwrap().release().await.unwrap();
        let info = a.describe(&name).await.unwrap().unwrap();
        assert_eq!(info.holders[0].hold_count, depth, "{info:?}");
        assert_eq!(store.releases(), 0, "a level's release reached the store");
    }
    levels.pop().unwrap().release().await.unwrap();
    assert_eq!(store.releases(), 1);
    let info = a.describe(&name).await.unwrap();
    assert!(
        info.as_ref().is_none_or(|i| i.holders.is_empty()),
        "{info:?}"
    );
    let again = lock.acquire().await.unwrap();
    assert_eq!(store.acquires(), 2);
    assert!(again.fencing_token() > token, "a new hold, a new token");
    again.release().await.unwrap();
}

/// Two acquires of one owner that wait at the same time: once the first is
/// granted, the second is its re-entry (same token, count 2), as the engine
/// decides, instead of queueing behind its own owner until the first's
/// release.
pub async fn racing_acquires_of_one_owner_share_the_grant<H: Harness>(h: &H) {
    let (a, b) = (client(h).await, client(h).await);
    let name = unique("racing-owner");
    let blocker = b.lock(name.as_str()).acquire().await.unwrap();
    let lock = a.lock(name.as_str()).owner("worker");
    let (first, second) = (lock.clone(), lock.clone());
    let first = tokio::spawn(async move { first.acquire().await });
    let second = tokio::spawn(async move { second.acquire().await });
    until_waiters(&a, &name, 1).await;
    blocker.release().await.unwrap();
    // A generous bound that only a second acquire queued behind its own
    // owner's hold would reach.
    let both = timeout(Duration::from_secs(20), async {
        (first.await.unwrap(), second.await.unwrap())
    });
    let (first, second) = both
        .await
        .expect("the second acquire of one owner waited for the first's release");
    let (first, second) = (first.unwrap(), second.unwrap());
    assert_eq!(first.fencing_token(), second.fencing_token());
    assert_eq!(second.hold_count(), 2);
    let info = a.describe(&name).await.unwrap().unwrap();
    assert_eq!(info.holders.len(), 1, "{info:?}");
    assert_eq!(info.holders[0].hold_count, 2);
    first.release().await.unwrap();
    assert!(b.lock(name.as_str()).try_acquire().await.unwrap().is_none());
    second.release().await.unwrap();
    assert!(b.lock(name.as_str()).try_acquire().await.unwrap().is_some());
}

/// While an acquire of an owner waits, a no-wait acquire of the same owner
/// finds the lock busy (it would queue behind it); once the owner holds, a
/// non-reentrant acquire of it is refused, and after the release it is
/// granted.
pub async fn waiting_owner_is_busy_to_itself<H: Harness>(h: &H) {
    let (a, b) = (client(h).await, client(h).await);
    let name = unique("waiting-owner");
    let blocker = b.lock(name.as_str()).acquire().await.unwrap();
    let lock = a.lock(name.as_str()).owner("worker");
    let waiting = tokio::spawn({
        let lock = lock.clone();
        async move { lock.acquire().await }
    });
    until_waiters(&a, &name, 1).await;
    assert!(lock.try_acquire().await.unwrap().is_none());
    blocker.release().await.unwrap();
    let held = waiting.await.unwrap().unwrap();
    match lock.clone().reentrant(false).try_acquire().await {
        Err(Error::AlreadyHeld { .. }) => {}
        other => panic!("the owner holds: expected AlreadyHeld, got {other:?}"),
    }
    held.release().await.unwrap();
    let again = lock.reentrant(false).try_acquire().await.unwrap();
    assert!(again.is_some(), "free again after the owner's release");
}

/// Where lock-delay is enforced, a hold that expires keeps others out for the
/// delay; elsewhere asking for one is refused before anything is held.
pub async fn lock_delay_holds_the_lock_back<H: Harness>(h: &H) {
    let (a, b) = (client(h).await, client(h).await);
    let name = unique("lock-delay");
    let ttl = h.short_ttl();
    // Long beside the time a loss takes to reach the client (well under a
    // TTL), so that the refused acquire below surely falls within it.
    let delay = ttl * 4;
    let lock = a.lock(name.as_str()).lease(ttl).lock_delay(delay);
    if !a.backend().capabilities().lock_delay {
        match lock.acquire().await {
            Err(Error::Unsupported { .. }) => {}
            other => panic!("lock-delay must be refused here, got {other:?}"),
        }
        assert!(a.describe(&name).await.unwrap().is_none(), "nothing held");
        return;
    }
    let guard = lock.acquire().await.unwrap();
    timeout(ttl * 10, guard.lost()).await.expect("lease ends");
    assert!(
        b.lock(name.as_str()).try_acquire().await.unwrap().is_none(),
        "granted within the lock-delay"
    );
    let next = b
        .lock(name.as_str())
        .acquire_timeout(delay * 2)
        .await
        .expect("granted once the delay is over");
    assert!(next.fencing_token() > guard.fencing_token());
}

/// A multi-lock is one hold: losing any of its locks loses it, and its
/// release frees every lock, on stores that take multi-locks atomically and
/// on those where they are taken one by one.
pub async fn multi_lock_is_lost_with_any_part<H: Harness>(h: &H) {
    let (a, admin) = (client(h).await, client(h).await);
    let (x, y) = (unique("multi-lost-a"), unique("multi-lost-b"));
    let guard = a
        .multi_lock([y.as_str(), x.as_str()])
        .acquire()
        .await
        .unwrap();
    assert_eq!(guard.names(), [y.clone(), x.clone()]);
    admin.force_release(&x).await.unwrap();
    timeout(h.short_ttl() * 20, guard.lost())
        .await
        .expect("lost() fires once one part is gone");
    assert!(matches!(guard.release().await, Err(Error::Lost(_))));
    assert!(admin
        .lock(y.as_str())
        .try_acquire()
        .await
        .unwrap()
        .is_some());
}
/// A guard tells its re-entry depth and what is left of its lease.
pub async fn guard_tells_count_and_lease<H: Harness>(h: &H) {
    let a = client(h).await;
    let name = unique("guard-info");
    let first = a.lock(name.as_str()).owner("o").acquire().await.unwrap();
    assert_eq!(first.hold_count(), 1);
    assert_eq!(
        first.remaining_lease(),
        None,
        "no lease: the session keeps it"
    );
    let second = a.lock(name.as_str()).owner("o").acquire().await.unwrap();
    assert_eq!((first.hold_count(), second.hold_count()), (2, 2));
    second.release().await.unwrap();
    assert_eq!(first.hold_count(), 1);
    first.release().await.unwrap();

    let lease = h.short_ttl() * 20;
    let leased = a.lock(name.as_str()).lease(lease).acquire().await.unwrap();
    let left = leased.remaining_lease().expect("a leased hold");
    assert!(left <= lease && !left.is_zero(), "{left:?} of {lease:?}");
    leased.extend(lease * 2).await.unwrap();
    let left = leased.remaining_lease().unwrap();
    assert!(
        left > lease && left <= lease * 2,
        "{left:?} after extending"
    );
    leased.release().await.unwrap();
}

/// An administrator's force-release ends a hold: its guard is lost with the
/// cause the harness declares, releasing it is [`Error::Lost`], and the next
/// grant's token is higher.
pub async fn force_release_fires_lost<H: Harness>(h: &H) {
    let (a, admin) = (client(h).await, client(h).await);
    let name = unique("force");
    let guard = a.lock(name.as_str()).acquire().await.unwrap();
    admin.force_release(&name).await.unwrap();
    let reason = timeout(h.short_ttl() * 20, guard.lost())
        .await
        .expect("lost() fires after a force-release");
    assert_lost_with(&guard, h.force_release_causes(), &reason);
    let token = guard.fencing_token();
    assert!(matches!(guard.release().await, Err(Error::Lost(_))));
    let next = admin
        .lock(name.as_str())
        .acquire_timeout(h.short_ttl() * 10)
        .await
        .expect("free after the force-release");
    assert!(next.fencing_token() > token);
    next.release().await.unwrap();
}

/// Extending a leased hold moves its end: extended again and again it
/// outlives its first lease, still held; left alone it ends, and an extend
/// after that is [`Error::Lost`]. A backend without extend refuses it with
/// [`Error::Unsupported`].
pub async fn extend_moves_a_lease<H: Harness>(h: &H) {
    let (a, b) = (client(h).await, client(h).await);
    let name = unique("extend");
    let lease = h.short_ttl() * 2;
    let guard = a.lock(name.as_str()).lease(lease).acquire().await.unwrap();
    match guard.extend(lease).await {
        Ok(()) => {}
        Err(Error::Unsupported { .. }) => return,
        Err(other) => panic!("extend while held: {other:?}"),
    }
    // Held past the first lease, by extensions longer than it (on etcd: a
    // lease of its own).
    let extended = lease * 5 / 4;
    let started = Instant::now();
    while started.elapsed() < extended {
        sleep(lease / 4).await;
        guard.extend(extended).await.expect("extend while held");
    }
    assert!(!guard.is_lost(), "{:?}", guard.lost_signal().reason());
    let info = b.describe(&name).await.unwrap().expect("still held");
    assert_eq!(info.holders.len(), 1);
    let token = guard.fencing_token();
    assert_eq!(info.holders[0].fencing_token.unwrap_or(token), token);
    assert!(b.lock(name.as_str()).try_acquire().await.unwrap().is_none());
    let reason = timeout(lease * 4, guard.lost())
        .await
        .expect("the lease ends once no longer extended");
    assert_lost_with(&guard, &[LostCause::LeaseExpired], &reason);
    assert!(matches!(guard.extend(lease).await, Err(Error::Lost(_))));
    let next = b
        .lock(name.as_str())
        .acquire_timeout(lease * 4)
        .await
        .expect("free after the lease");
    assert!(next.fencing_token() > guard.fencing_token());
    next.release().await.unwrap();
}

/// Closing a client releases all it holds (session holds, leases, every
/// re-entry level), fires their lost signals with
/// [`LostCause::ClientClosed`], and refuses further acquires.
pub async fn close_releases_everything<H: Harness>(h: &H) {
    let (a, b) = (client(h).await, client(h).await);
    let (x, y, z) = (unique("close-x"), unique("close-y"), unique("close-z"));
    let gx = a.lock(x.as_str()).acquire().await.unwrap();
    let gy = a.lock(y.as_str()).owner("o").acquire().await.unwrap();
    let again = a.lock(y.as_str()).owner("o").acquire().await.unwrap();
    let leased = a
        .lock(z.as_str())
        .lease(h.short_ttl() * 30)
        .acquire()
        .await
        .unwrap();
    a.close().await.unwrap();
    for guard in [&gx, &gy, &again, &leased] {
        assert!(
            guard.is_lost(),
            "{:?} still held after close",
            guard.names()
        );
        assert_eq!(guard.lost_cause(), Some(LostCause::ClientClosed));
    }
    for name in [&x, &y, &z] {
        assert!(
            b.lock(name.as_str()).try_acquire().await.unwrap().is_some(),
            "{name} still held after close"
        );
    }
    assert!(matches!(
        a.lock(unique("after-close").as_str()).try_acquire().await,
        Err(Error::Closed)
    ));
}

/// A session the store ends (as on its expiry) loses the holds it kept with
/// the cause the harness declares; the waiter behind gets the lock with a
/// higher token, and the client carries on with a new session.
pub async fn expired_session_fires_lost_and_hands_over<H: Harness>(h: &H) {
    let (a, b) = (client(h).await, client(h).await);
    let name = unique("expire");
    let held = a.lock(name.as_str()).acquire().await.unwrap();
    let waiter = tokio::spawn({
        let lock = b.lock(name.as_str());
        async move { lock.acquire().await }
    });
    until_waiters(&b, &name, 1).await;
    let Fault::Injected(causes) = h.expire_session(&a).await else {
        waiter.abort();
        return skipped::<H>(
            "expired_session_fires_lost_and_hands_over",
            "expire a session",
        );
    };
    let limit = h.short_ttl() * 20;
    let reason = timeout(limit, held.lost())
        .await
        .expect("lost() fires when the session ends");
    assert_lost_with(&held, causes, &reason);
    let next = timeout(limit, waiter)
        .await
        .expect("the waiter gets the lock")
        .unwrap()
        .unwrap();
    assert!(next.fencing_token() > held.fencing_token());
    assert!(matches!(held.release().await, Err(Error::Lost(_))));
    next.release().await.unwrap();
    let again = timeout(limit, a.lock(name.as_str()).acquire())
        .await
        .expect("the client works again, on a new session")
        .unwrap();
    again.release().await.unwrap();
}

/// A client cut off its store reports its session holds lost (with the cause
/// the harness declares) within a few session TTLs, and before anyone else
/// is granted the lock; once the connection is back the lock is handed over
/// with a higher token, and the client works again.
pub async fn cut_connection_fires_lost_before_handover<H: Harness>(h: &H) {
    let ttl = h.short_ttl() * 2;
    let (a, b) = (h.connect(ttl).await, client(h).await);
    let name = unique("cut");
    let held = a.lock(name.as_str()).acquire().await.unwrap();
    let waiter = tokio::spawn({
        let lock = b.lock(name.as_str());
        async move {
            let guard = lock.acquire().await;
            (guard, Instant::now())
        }
    });
    until_waiters(&b, &name, 1).await;
    let Fault::Injected(causes) = h.cut_connection(&a).await else {
        waiter.abort();
        return skipped::<H>(
            "cut_connection_fires_lost_before_handover",
            "cut a connection",
        );
    };
    let reason = timeout(ttl * 5, held.lost()).await;
    let lost_at = Instant::now();
    h.restore_connection(&a).await;
    let reason = reason.expect("lost() fires while the connection is cut");
    assert_lost_with(&held, causes, &reason);
    let (next, granted_at) = timeout(h.short_ttl() * 20, waiter)
        .await
        .expect("the waiter gets the lock")
        .unwrap();
    let next = next.unwrap();
    assert!(
        granted_at >= lost_at,
        "granted elsewhere before the holder knew it lost the lock"
    );
    assert!(next.fencing_token() > held.fencing_token());
    assert!(matches!(held.release().await, Err(Error::Lost(_))));
    next.release().await.unwrap();
    let again = timeout(h.short_ttl() * 20, a.lock(name.as_str()).acquire())
        .await
        .expect("the client works again once reconnected")
        .unwrap();
    again.release().await.unwrap();
}

/// A harness for a store reached by one URL, with [`DISK_SHORT_TTL`]: what
/// a suite needs when the store has no faults of its own to inject.
pub struct UrlHarness {
    /// The store's URL.
    pub url: String,
}

impl Harness for UrlHarness {
    /// A client of the URL.
    ///
    /// Cancel safety: safe, as `Client::connect_with`.
    async fn connect(&self, session_ttl: Duration) -> Client {
        let options = ConnectOptions::default().session_ttl(session_ttl);
        Client::connect_with(&self.url, options)
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.url))
    }

    fn short_ttl(&self) -> Duration {
        DISK_SHORT_TTL
    }
}
