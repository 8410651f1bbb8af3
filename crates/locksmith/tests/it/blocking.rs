//! `locksmith::blocking` from plain threads, against `memory://` and against
//! a locksmith server started in this process: the blocking calls, drop
//! releasing (and closing) before it returns, and the refusal to block a
//! thread that runs async tasks.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use locksmith::blocking::Client;
use locksmith::{Error, LostCause};
use locksmith_server::{Server, ServerConfig};

/// Where the clients of one test connect.
trait Backend {
    fn url(&self) -> String;
}

/// A fresh in-process table per test. Its timers run on the runtime of the
/// first client that opens it, which every test keeps alive to its end.
struct Memory {
    url: String,
}

impl Memory {
    fn new() -> Memory {
        Memory {
            url: format!("memory://{}", uuid::Uuid::new_v4().simple()),
        }
    }
}

impl Backend for Memory {
    fn url(&self) -> String {
        self.url.clone()
    }
}

/// A locksmith server (in memory, on a loopback port) on a runtime of its own.
struct LockServer {
    server: Option<Server>,
    runtime: tokio::runtime::Runtime,
}

impl LockServer {
    fn new() -> LockServer {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("server runtime");
        let config = ServerConfig::in_memory().listen("127.0.0.1:0".parse().unwrap());
        let server = runtime
            .block_on(Server::start(config))
            .expect("start the lock server");
        LockServer {
            server: Some(server),
            runtime,
        }
    }
}

impl Backend for LockServer {
    fn url(&self) -> String {
        self.server.as_ref().expect("running").url()
    }
}

impl Drop for LockServer {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            let _ = self.runtime.block_on(server.shutdown());
        }
    }
}

fn client(backend: &impl Backend) -> Client {
    Client::connect(&backend.url()).expect("connect")
}

fn unique(test: &str) -> String {
    format!("blocking/{test}/{}", uuid::Uuid::new_v4().simple())
}

/// Waits (bounded) until `name` has `waiters` waiters.
fn until_waiters(client: &Client, name: &str, waiters: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info = client.describe(name).expect("describe");
        if info.is_some_and(|info| info.waiters.len() == waiters) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name} never had {waiters} waiter(s)"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn acquire_and_release(backend: &impl Backend) {
    let (a, b) = (client(backend), client(backend));
    let name = unique("acquire");
    let guard = a.lock(name.as_str()).acquire().expect("acquire");
    assert_eq!(guard.name(), name);
    assert_eq!(guard.names(), std::slice::from_ref(&name));
    assert_eq!(guard.fencing_tokens(), [guard.fencing_token()]);
    assert!(!guard.is_lost());
    assert!(b.lock(name.as_str()).try_acquire().unwrap().is_none());
    guard.release().expect("checked release");
    let next = b.lock(name.as_str()).try_acquire().unwrap();
    assert!(next.is_some(), "released lock is free");
}

fn second_acquirer_waits_until_guard_dropped(backend: &impl Backend) {
    let (a, b) = (client(backend), client(backend));
    let name = unique("wait");
    let first = a.lock(name.as_str()).acquire().unwrap();
    let (granted, grant) = mpsc::channel();
    let waiter = std::thread::spawn({
        let lock = b.lock(name.as_str());
        move || granted.send(lock.acquire()).unwrap()
    });
    until_waiters(&a, &name, 1);
    assert!(
        grant.try_recv().is_err(),
        "the second acquire must wait while the first guard lives"
    );
    let token = first.fencing_token();
    drop(first);
    let second = grant
        .recv_timeout(Duration::from_secs(10))
        .expect("the waiter is granted once the guard is dropped")
        .expect("acquire");
    assert!(second.fencing_token() > token);
    waiter.join().unwrap();
}

fn drop_releases_before_returning(backend: &impl Backend) {
    let (a, b) = (client(backend), client(backend));
    let name = unique("drop");
    for _ in 0..20 {
        let guard = a.lock(name.as_str()).acquire().unwrap();
        drop(guard);
        let next = b.lock(name.as_str()).try_acquire().unwrap();
        assert!(next.is_some(), "drop returned before the release");
        drop(next);
        assert!(a.lock(name.as_str()).try_acquire().unwrap().is_some());
    }
}

fn timed_acquire_times_out(backend: &impl Backend) {
    let (a, b) = (client(backend), client(backend));
    let name = unique("timeout");
    let _held = a.lock(name.as_str()).acquire().unwrap();
    let wait = Duration::from_millis(200);
    let started = Instant::now();
    match b.lock(name.as_str()).acquire_timeout(wait) {
        Err(Error::Timeout(after)) => assert_eq!(after, wait),
        other => panic!("expected Error::Timeout, got {other:?}"),
    }
    assert!(started.elapsed() >= wait);
    match b.lock(name.as_str()).wait(wait).acquire() {
        Err(Error::Timeout(after)) => assert_eq!(after, wait),
        other => panic!("expected Error::Timeout from the wait option, got {other:?}"),
    }
    until_waiters(&a, &name, 0);
}

fn fencing_tokens_increase(backend: &impl Backend) {
    let clients = [client(backend), client(backend)];
    let name = unique("tokens");
    let mut last = 0;
    for round in 0..6 {
        let guard = clients[round % 2].lock(name.as_str()).acquire().unwrap();
        assert!(guard.fencing_token() > last, "round {round}");
        last = guard.fencing_token();
    }
}

fn force_release_fires_lost(backend: &impl Backend) {
    let (holder, admin) = (client(backend), client(backend));
    let name = unique("force");
    let guard = holder.lock(name.as_str()).acquire().unwrap();
    assert_eq!(guard.lost_timeout(Duration::from_millis(20)), None);
    admin.force_release(&name).unwrap();
    let reason = guard
        .lost_timeout(Duration::from_secs(10))
        .expect("lost fires after force_release");
    assert!(!reason.is_empty());
    assert!(guard.is_lost());
    assert!(guard.lost_signal().is_fired());
    assert_eq!(guard.lost_cause(), Some(LostCause::ForceReleased));
    assert_eq!(guard.lost(), reason);
    assert!(admin.lock(name.as_str()).try_acquire().unwrap().is_some());
    assert!(guard.release().is_err(), "a lost hold's release is refused");
}

fn lease_and_extend(backend: &impl Backend) {
    let a = client(backend);
    let name = unique("lease");
    let leased = a
        .lock(name.as_str())
        .lease(Duration::from_secs(5))
        .acquire()
        .unwrap();
    let left = leased.remaining_lease().expect("a leased hold");
    assert!(left <= Duration::from_secs(5), "{left:?}");
    leased.extend(Duration::from_secs(10)).expect("extend");
    let left = leased.remaining_lease().unwrap();
    assert!(
        left > Duration::from_secs(5) && left <= Duration::from_secs(10),
        "{left:?}"
    );
    leased.release().unwrap();
    let session = a.lock(name.as_str()).acquire().unwrap();
    assert_eq!(session.remaining_lease(), None);
    assert!(matches!(
        session.extend(Duration::from_secs(10)),
        Err(Error::InvalidArgument(_))
    ));
}

fn options_inspection_and_modes(backend: &impl Backend) {
    let (a, b) = (client(backend), client(backend));
    let name = unique("inspect");
    let lock = a.lock(name.as_str()).owner("inspector").reentrant(true);
    assert_eq!(lock.options().owner.as_deref(), Some("inspector"));
    assert_eq!(lock.names(), std::slice::from_ref(&name));
    let guard = lock.acquire().unwrap();
    let again = lock.acquire().expect("re-entry");
    assert_eq!(again.fencing_token(), guard.fencing_token());
    assert_eq!((guard.hold_count(), again.hold_count()), (2, 2));
    drop(again);
    assert_eq!(guard.hold_count(), 1);
    let info = b.describe(&name).unwrap().expect("held lock is described");
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.holders[0].owner, "inspector");
    let listed = b.list(&name).unwrap();
    assert_eq!(listed.len(), 1);
    drop(guard);
    assert!(b.describe(&name).unwrap().is_none());

    let rw = unique("rw");
    let r1 = a.rw_lock(rw.as_str()).read().acquire().unwrap();
    let r2 = b.rw_lock(rw.as_str()).read().acquire().unwrap();
    assert!(b
        .rw_lock(rw.as_str())
        .write()
        .try_acquire()
        .unwrap()
        .is_none());
    drop((r1, r2));
    assert!(b
        .rw_lock(rw.as_str())
        .write()
        .try_acquire()
        .unwrap()
        .is_some());

    let gpu = unique("semaphore");
    let p1 = a.semaphore(gpu.as_str(), 2).acquire().unwrap();
    let p2 = b.semaphore(gpu.as_str(), 2).acquire().unwrap();
    assert!(a
        .semaphore(gpu.as_str(), 2)
        .try_acquire()
        .unwrap()
        .is_none());
    drop((p1, p2));

    let (x, y) = (unique("multi-x"), unique("multi-y"));
    let both = a.multi_lock([x.as_str(), y.as_str()]).acquire().unwrap();
    assert_eq!(both.fencing_tokens().len(), 2);
    assert!(b.lock(y.as_str()).try_acquire().unwrap().is_none());
    drop(both);
    assert!(b.lock(y.as_str()).try_acquire().unwrap().is_some());
}

fn election_leads_and_steps_down(backend: &impl Backend) {
    let (a, b) = (client(backend), client(backend));
    let name = unique("election");
    let election = a.election(name.as_str());
    assert_eq!(election.leader().unwrap(), None);
    let mut observed = b.election(name.as_str()).observe();
    assert_eq!(observed.next().unwrap().unwrap(), None);
    let mut leadership = election.campaign("node-1").unwrap();
    assert_eq!(observed.next().unwrap().unwrap().unwrap().value, "node-1");
    match leadership.proclaim("node-1b") {
        Ok(()) => assert_eq!(observed.next().unwrap().unwrap().unwrap().value, "node-1b"),
        Err(Error::Unsupported { .. }) => assert!(!a.backend().capabilities().proclaim),
        Err(other) => panic!("proclaim failed: {other}"),
    }
    let leader = b
        .election(name.as_str())
        .leader()
        .unwrap()
        .expect("a leader");
    assert_eq!(leader.value, leadership.value());
    if let Some(token) = leader.fencing_token {
        assert_eq!(token, leadership.fencing_token());
    }
    let (elected, next) = mpsc::channel();
    let candidate = std::thread::spawn({
        let election = b.election(name.as_str());
        move || elected.send(election.campaign("node-2")).unwrap()
    });
    until_waiters(&a, &name, 1);
    drop(leadership);
    let second = next
        .recv_timeout(Duration::from_secs(10))
        .expect("the next candidate leads once the leader steps down")
        .unwrap();
    assert_eq!(
        a.election(name.as_str()).leader().unwrap().unwrap().value,
        "node-2"
    );
    second.resign().unwrap();
    candidate.join().unwrap();
}

fn guard_keeps_its_client_open(backend: &impl Backend) {
    let (a, b) = (client(backend), client(backend));
    let name = unique("keep-open");
    let guard = a.lock(name.as_str()).acquire().unwrap();
    drop(a);
    assert!(!guard.is_lost());
    assert!(b.lock(name.as_str()).try_acquire().unwrap().is_none());
    drop(guard); // releases, then closes the client (its last handle)
    assert!(b.lock(name.as_str()).try_acquire().unwrap().is_some());
    // A guard made from a temporary client works as long as it lives.
    let guard = Client::connect(&backend.url())
        .unwrap()
        .lock(name.as_str())
        .acquire()
        .unwrap();
    assert!(b.lock(name.as_str()).try_acquire().unwrap().is_none());
    guard.release().unwrap();
}

fn close_releases_everything(backend: &impl Backend) {
    let (a, b) = (client(backend), client(backend));
    let name = unique("close");
    let guard = a.lock(name.as_str()).acquire().unwrap();
    a.close().expect("close");
    assert!(b.lock(name.as_str()).try_acquire().unwrap().is_some());
    assert!(guard.release().is_err(), "the hold ended with the client");
}

macro_rules! tests {
    ($backend:ident: $($test:ident),* $(,)?) => {
        mod $backend {
            $(
                #[test]
                fn $test() {
                    super::$test(&super::$backend());
                }
            )*
        }
    };
}

fn memory() -> Memory {
    Memory::new()
}

fn server() -> LockServer {
    LockServer::new()
}

tests!(memory: acquire_and_release, second_acquirer_waits_until_guard_dropped,
    drop_releases_before_returning, timed_acquire_times_out, fencing_tokens_increase,
    force_release_fires_lost, lease_and_extend, options_inspection_and_modes,
    election_leads_and_steps_down, guard_keeps_its_client_open, close_releases_everything);

tests!(server: acquire_and_release, second_acquirer_waits_until_guard_dropped,
    drop_releases_before_returning, timed_acquire_times_out, fencing_tokens_increase,
    force_release_fires_lost, lease_and_extend, options_inspection_and_modes,
    election_leads_and_steps_down, guard_keeps_its_client_open, close_releases_everything);

/// Dropping the last handle closes the client before `drop` returns: the
/// `memory://` table only it used is gone by then, so a new client on the
/// same URL finds a fresh table (tokens start over).
#[test]
fn dropping_the_last_handle_closes_the_client() {
    let backend = Memory::new();
    let first = client(&backend);
    let token = first.lock("a").acquire().unwrap().fencing_token();
    drop(first);
    for round in 0..30 {
        let fresh = client(&backend);
        let guard = fresh.lock("a").acquire().unwrap();
        assert_eq!(
            guard.fencing_token(),
            token,
            "round {round}: the table lived on"
        );
    }
}

/// Threads share clients, locks and guards.
#[test]
fn handles_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Client>();
    send_sync::<locksmith::blocking::Lock>();
    send_sync::<locksmith::blocking::RwLock>();
    send_sync::<locksmith::blocking::Guard>();
    send_sync::<locksmith::blocking::Election>();
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

#[track_caller]
fn assert_clear_refusal(result: std::thread::Result<impl std::fmt::Debug>, call: &str) {
    let message = panic_message(result.expect_err("a blocking call inside a runtime must panic"));
    assert!(
        message.contains(&format!("locksmith::blocking::{call}"))
            && message.contains("inside an async runtime")
            && message.contains("spawn_blocking"),
        "unclear message: {message}"
    );
}

#[test]
fn blocking_calls_inside_an_async_runtime_panic_clearly() {
    let backend = Memory::new();
    let client = client(&backend);
    let lock = client.lock("inside");

    let current = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let connect = current
        .block_on(async { catch_unwind(|| Client::connect(&backend.url())).map(|c| c.is_ok()) });
    assert_clear_refusal(connect, "Client::connect");

    let multi = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // In the runtime's block_on (what #[tokio::main] runs).
    let acquire = multi.block_on(async {
        catch_unwind(AssertUnwindSafe(|| lock.try_acquire().map(|g| g.is_some())))
    });
    assert_clear_refusal(acquire, "Lock::try_acquire");
    // In a task on a worker thread.
    let in_task = multi
        .block_on(multi.spawn({
            let client = client.clone();
            async move { catch_unwind(AssertUnwindSafe(|| client.list("").map(|l| l.len()))) }
        }))
        .unwrap();
    assert_clear_refusal(in_task, "Client::list");

    // spawn_blocking threads are made for blocking calls: they work.
    let guard = multi
        .block_on(multi.spawn_blocking({
            let lock = lock.clone();
            move || lock.try_acquire()
        }))
        .unwrap()
        .unwrap()
        .expect("free lock");

    // A guard dropped on a runtime thread cannot wait: it is released on a
    // helper thread, and the drop neither blocks nor panics.
    multi.block_on(async move { drop(guard) });
    let other = Client::connect(&backend.url()).unwrap();
    let _released = other
        .lock("inside")
        .acquire_timeout(Duration::from_secs(10))
        .expect("the guard dropped in the runtime is released");
    // Likewise the last handle of a client.
    let doomed = Client::connect(&backend.url()).unwrap();
    multi.block_on(async move { drop(doomed) });
}
