//! The conformance suite and ZooKeeper-specific tests against a real ZooKeeper
//! (one shared server per test binary: the JVM starts slowly), plus
//! interoperability with kazoo's `Lock` and `Election` (Python, `pip install
//! kazoo`) and Curator. The suite's harness expires a client's session (closed
//! from a second connection) and cuts its connection (its own fault proxies).

use std::process::Stdio;
use std::sync::{Arc, Weak};
use std::time::Duration;

use locksmith::zookeeper::ZooKeeperBackend;
use locksmith::{Client, ConnectOptions, Error, LostCause, Mode};
use locksmith_testkit::conformance::{Clients, Fault, Harness, DISK_SHORT_TTL};
use locksmith_testkit::proxy::{self, Route};
use locksmith_testkit::ZooKeeper;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::time::{sleep, timeout};
use zookeeper_client as zk;

/// Every test of this binary lives under this chroot of the shared server (the
/// backend creates it on connect).
const CHROOT: &str = "/locksmith-tests";

/// The shared server, started off the async runtime (the JVM takes seconds).
async fn shared() -> &'static ZooKeeper {
    tokio::task::spawn_blocking(ZooKeeper::shared)
        .await
        .expect("start ZooKeeper")
}

/// The suite's harness: clients of the shared server, each through fault
/// proxies of its own and on a backend the harness keeps, to reach its
/// ZooKeeper session for faults.
struct Zk {
    server: &'static ZooKeeper,
    url: String,
    clients: Clients<(Weak<ZooKeeperBackend>, Arc<Route>)>,
}

impl Harness for Zk {
    async fn connect(&self, session_ttl: Duration) -> Client {
        let route = Route::start(&self.url).await.expect("fault proxies");
        let (backend, client) = backend(route.url(), session_ttl).await;
        self.clients
            .remember(&client, (Arc::downgrade(&backend), Arc::new(route)));
        client
    }

    /// Session pings are answered without a sync, but every lease renewal
    /// and hold is a logged write.
    fn short_ttl(&self) -> Duration {
        DISK_SHORT_TTL
    }

    /// The holder sees its node deleted.
    fn force_release_causes(&self) -> &'static [LostCause] {
        &[LostCause::Gone]
    }

    /// Closes the client's session from a second connection with its id and
    /// password: the server ends it as it would on expiry.
    async fn expire_session(&self, client: &Client) -> Fault {
        let backend = self.clients.of(client).0.upgrade().expect("a live client");
        let zookeeper = backend.zookeeper().expect("a session");
        let session = zookeeper.session().clone();
        // The client reconnecting in between moves the session back and
        // makes a close miss; then close it again.
        for _ in 0..20 {
            close_session(self.server, &session).await;
            for _ in 0..200 {
                if matches!(
                    zookeeper.state(),
                    zk::SessionState::Expired | zk::SessionState::Closed
                ) {
                    // Usually the client learns of the session's end first.
                    // When its reconnect won the race (and re-armed its
                    // watch), the server's close deletes the node and says
                    // so before it closes the connection: then the client
                    // can say only that the node is gone.
                    return Fault::Injected(&[
                        LostCause::SessionExpired,
                        LostCause::SessionClosed,
                        LostCause::Gone,
                    ]);
                }
                sleep(Duration::from_millis(10)).await;
            }
        }
        panic!("the session outlived 20 closes");
    }

    /// Blackholes the client's proxies: its connection is suspended, and it
    /// gives its holds up before the server can expire the session.
    async fn cut_connection(&self, client: &Client) -> Fault {
        self.clients.of(client).1.set(proxy::Mode::Blackhole);
        Fault::Injected(&[LostCause::ConnectionLost])
    }

    async fn restore_connection(&self, client: &Client) {
        self.clients.of(client).1.set(proxy::Mode::Pass);
    }
}

async fn connect(url: &str, session_ttl: Duration) -> Client {
    let options = ConnectOptions::default().session_ttl(session_ttl);
    Client::connect_with(url, options)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"))
}

async fn zk_harness() -> Zk {
    let server = shared().await;
    Zk {
        server,
        url: format!("{}{CHROOT}", server.url()),
        clients: Clients::default(),
    }
}

locksmith_testkit::conformance_suite!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    zk_harness()
);

/// A lock name no other test uses.
fn unique(test: &str) -> String {
    let run = uuid::Uuid::new_v4().simple().to_string();
    format!("zk/{}/{test}", &run[..8])
}

/// A raw ZooKeeper client on the shared server, rooted at `/`.
async fn raw(server: &ZooKeeper) -> zk::Client {
    zk::Client::connect(&server.connect_string())
        .await
        .expect("raw ZooKeeper client")
}

/// Waits (polling inspection, at most 20 s) until `check` holds for `name`.
async fn until(
    client: &Client,
    name: &str,
    what: &str,
    check: impl Fn(&locksmith::LockInfo) -> bool,
) {
    for _ in 0..2000 {
        if let Some(info) = client.describe(name).await.expect("describe") {
            if check(&info) {
                return;
            }
        }
        sleep(Duration::from_millis(10)).await;
    }
    panic!("{name}: never saw {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nodes_follow_curator_layouts() {
    let server = shared().await;
    let client = connect(
        &format!("{}{CHROOT}", server.url()),
        Duration::from_secs(10),
    )
    .await;
    let raw = raw(server).await;
    let name = unique("layout");
    let path = format!("{CHROOT}/{name}");

    let guard = client
        .lock(name.as_str())
        .owner("layout-owner")
        .acquire()
        .await
        .unwrap();
    let children = raw.list_children(&path).await.unwrap();
    assert_eq!(children.len(), 1, "{children:?}");
    let node = &children[0];
    // `_c_` + canonical UUID + `-lock-` + ten digits (Curator InterProcessMutex).
    assert!(node.starts_with("_c_"), "{node}");
    assert_eq!(node.len(), 3 + 36 + 1 + "lock-".len() + 10, "{node}");
    assert!(node[40..].starts_with("lock-"), "{node}");
    let (data, stat) = raw.get_data(&format!("{path}/{node}")).await.unwrap();
    assert_eq!(data, b"layout-owner");
    assert_eq!(stat.czxid as u64, guard.fencing_token());
    assert_ne!(stat.ephemeral_owner, 0, "lock nodes are ephemeral");
    guard.release().await.unwrap();
    assert!(raw
        .list_children(&path)
        .await
        .unwrap_or_default()
        .is_empty());

    let rw = unique("layout-rw");
    let reader = client.rw_lock(rw.as_str()).read().acquire().await.unwrap();
    let children = raw.list_children(&format!("{CHROOT}/{rw}")).await.unwrap();
    assert!(children[0].contains("-__READ__"), "{children:?}");
    // A writer on a read-write path queues as `__WRIT__`.
    let writer = tokio::spawn({
        let lock = client.rw_lock(rw.as_str()).write();
        async move { lock.acquire().await }
    });
    // (It first queues as `lock-`, sees the read-write nodes, and moves.)
    let mut children = Vec::new();
    for _ in 0..2000 {
        children = raw.list_children(&format!("{CHROOT}/{rw}")).await.unwrap();
        if children.len() == 2 && children.iter().any(|c| c.contains("-__WRIT__")) {
            break;
        }
        sleep(Duration::from_millis(10)).await;
    }
    assert!(
        children.len() == 2 && children.iter().any(|c| c.contains("-__WRIT__")),
        "{children:?}"
    );
    until(&client, &rw, "a waiting writer", |i| i.waiters.len() == 1).await;
    reader.release().await.unwrap();
    writer.await.unwrap().unwrap().release().await.unwrap();

    let sem = unique("layout-sem");
    let permit = client.semaphore(sem.as_str(), 3).acquire().await.unwrap();
    let sem_path = format!("{CHROOT}/{sem}");
    let (data, _) = raw.get_data(&sem_path).await.unwrap();
    assert_eq!(data, b"3", "permits recorded as text (kazoo's convention)");
    let leases = raw
        .list_children(&format!("{sem_path}/leases"))
        .await
        .unwrap();
    assert_eq!(leases.len(), 1);
    assert!(leases[0].starts_with("_c_") && leases[0][40..].starts_with("lease-"));
    let (_, stat) = raw
        .get_data(&format!("{sem_path}/leases/{}", leases[0]))
        .await
        .unwrap();
    assert_eq!(stat.czxid as u64, permit.fencing_token());
    // The entry mutex was released once the lease was taken.
    assert!(raw
        .list_children(&format!("{sem_path}/locks"))
        .await
        .unwrap()
        .is_empty());
    permit.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn foreign_contenders_queue_by_sequence() {
    let server = shared().await;
    let client = connect(
        &format!("{}{CHROOT}", server.url()),
        Duration::from_secs(10),
    )
    .await;
    let raw = raw(server).await;
    let name = unique("foreign");
    let path = format!("{CHROOT}/{name}");
    raw.mkdir(
        &path,
        &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
    )
    .await
    .unwrap();
    // A kazoo-style contender (`<hex>__lock__<seq>`) holds the lock.
    let ephemeral = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let (stat, sequence) = raw
        .create(
            &format!("{path}/0123abcd__lock__"),
            b"kazoo-ish",
            &ephemeral,
        )
        .await
        .unwrap();
    let foreign = format!("{path}/0123abcd__lock__{sequence}");
    assert!(client
        .lock(name.as_str())
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    let info = client.describe(&name).await.unwrap().unwrap();
    assert_eq!(info.holders[0].owner, "kazoo-ish");
    assert_eq!(info.holders[0].fencing_token, Some(stat.czxid as u64));
    let waiter = tokio::spawn({
        let lock = client.lock(name.as_str());
        async move { lock.acquire().await }
    });
    until(&client, &name, "one waiter", |i| i.waiters.len() == 1).await;
    assert!(!waiter.is_finished());
    raw.delete(&foreign, None).await.unwrap();
    let guard = timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter gets the lock")
        .unwrap()
        .unwrap();
    assert!(guard.fencing_token() > stat.czxid as u64);
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn list_walks_the_tree() {
    let server = shared().await;
    let client = connect(
        &format!("{}{CHROOT}", server.url()),
        Duration::from_secs(10),
    )
    .await;
    let base = unique("tree");
    let names = [
        format!("{base}/a"),
        format!("{base}/a/b"),
        format!("{base}/c/d"),
    ];
    let mut guards = Vec::new();
    for name in &names {
        guards.push(client.lock(name.as_str()).acquire().await.unwrap());
    }
    guards.push(
        client
            .semaphore(format!("{base}/s"), 2)
            .acquire()
            .await
            .unwrap(),
    );
    let listed = client.list(&base).await.unwrap();
    let listed: Vec<&str> = listed.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(
        listed,
        [
            names[0].as_str(),
            names[1].as_str(),
            names[2].as_str(),
            &format!("{base}/s")
        ]
    );
    let semaphore = client
        .describe(&format!("{base}/s"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(semaphore.holders[0].mode, Mode::Semaphore { permits: 2 });
    let partial = client.list(&format!("{base}/a")).await.unwrap();
    assert_eq!(partial.len(), 2);
}

/// A lock whose last segment is ten digits (a Unix time, say) has a path that
/// looks like a contender's sequence number; it must stay a lock of its own,
/// neither hidden from `list` nor queued ahead of its parent's contenders.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lock_named_by_digits_is_listed_and_blocks_no_parent() {
    let server = shared().await;
    let client = connect(
        &format!("{}{CHROOT}", server.url()),
        Duration::from_secs(10),
    )
    .await;
    let parent = unique("digits");
    let child = format!("{parent}/0000000000");
    let held = client.lock(child.as_str()).acquire().await.unwrap();
    let guard = client
        .lock(parent.as_str())
        .acquire_timeout(Duration::from_secs(2))
        .await
        .expect("the parent lock is free");
    let listed = client.list(&parent).await.unwrap();
    let listed: Vec<&str> = listed.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(listed, [parent.as_str(), child.as_str()]);
    guard.release().await.unwrap();
    held.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_urls_are_rejected_before_connecting() {
    for url in [
        "zk://",
        "zk://127.0.0.1:notaport",
        "zk://127.0.0.1:1/a//b",
        "zk://127.0.0.1:1?colour=blue",
    ] {
        assert!(
            matches!(Client::connect(url).await, Err(Error::InvalidUrl { .. })),
            "{url} accepted"
        );
    }
    let server = shared().await;
    let client = connect(
        &format!("{}{CHROOT}", server.url()),
        Duration::from_secs(10),
    )
    .await;
    let name = unique("delay");
    assert!(matches!(
        client
            .lock(name.as_str())
            .lock_delay(Duration::from_secs(1))
            .try_acquire()
            .await,
        Err(Error::Unsupported { .. })
    ));
}

// --- faults -----------------------------------------------------------------

/// A backend built by hand, so the test can reach its ZooKeeper session.
async fn backend(url: &str, session_ttl: Duration) -> (Arc<ZooKeeperBackend>, Client) {
    let options = ConnectOptions::default().session_ttl(session_ttl);
    let backend = Arc::new(
        ZooKeeperBackend::connect(url, &options)
            .await
            .expect("connect"),
    );
    let client = Client::from_backend(backend.clone());
    (backend, client)
}

/// Attaches to a session from a second connection and closes it there.
async fn close_session(server: &ZooKeeper, session: &zk::SessionInfo) {
    for _ in 0..200 {
        match zk::Client::connector()
            .with_session(session.clone())
            .with_fail_eagerly()
            .connect(&server.connect_string())
            .await
        {
            // Dropping the last handle of a session closes it.
            Ok(thief) => {
                drop(thief);
                return;
            }
            // zookeeper-client 0.11 starts a resumed session with an already
            // elapsed connect deadline, so an attempt can fail at once.
            Err(zk::Error::Timeout | zk::Error::NoHosts) => {}
            // Already gone.
            Err(zk::Error::SessionExpired) => return,
            Err(e) => panic!("cannot attach to the session: {e}"),
        }
    }
    panic!("cannot attach to the session");
}

// --- kazoo interop ----------------------------------------------------------

/// A kazoo client driven line by line over stdin/stdout.
const KAZOO: &str = r#"
import sys
from kazoo.client import KazooClient
from kazoo.exceptions import LockTimeout, NoAuthError
from kazoo.security import CREATOR_ALL_ACL

hosts, path, ident, mode = sys.argv[1:5]
# Optional digest credentials, with Curator's and locksmith's default ACL.
digest = sys.argv[5] if len(sys.argv) > 5 else None
if digest:
    zk = KazooClient(hosts=hosts, auth_data=[("digest", digest)], default_acl=CREATOR_ALL_ACL)
else:
    zk = KazooClient(hosts=hosts)
zk.start(timeout=30)

def say(*words):
    print(*words, flush=True)

if mode == "hold":
    lock = zk.Lock(path, ident)
    lock.acquire()
    say("HELD")
    sys.stdin.readline()
    lock.release()
    say("RELEASED")
elif mode == "contend":
    # kazoo only counts nodes with its own names unless told about Curator's.
    lock = zk.Lock(path, ident, extra_lock_patterns=["-lock-"])
    say("CONTENDERS", "|".join(lock.contenders()))
    try:
        lock.acquire(timeout=1.0)
        say("ACQUIRED-WHILE-HELD")
    except LockTimeout:
        say("TIMEOUT")
    say("WAITING")
    lock.acquire()
    say("ACQUIRED")
    sys.stdin.readline()
    lock.release()
    say("RELEASED")
elif mode == "elect":
    # kazoo's Election, as it is: it counts only `__lock__` nodes.
    election = zk.Election(path, ident)
    say("CONTENDERS", "|".join(election.contenders()))
    try:
        election.lock.acquire(timeout=1.0)
        say("LEADING-WHILE-LED")
        election.lock.release()
    except LockTimeout:
        say("TIMEOUT")
    say("WAITING")
    def lead():
        say("LEADING", "|".join(election.contenders()))
        sys.stdin.readline()
    election.run(lead)
    say("RESIGNED")
elif mode == "refused":
    try:
        zk.Lock(path, ident).acquire(timeout=5.0)
        say("ACQUIRED")
    except NoAuthError:
        say("NOAUTH")
elif mode == "read":
    lock = zk.ReadLock(path, ident)
    lock.acquire()
    say("HELD")
    sys.stdin.readline()
    lock.release()
    say("RELEASED")
zk.stop()
"#;

/// A Curator `LeaderSelector` driven line by line (Curator from Debian's
/// `libcurator-recipes-java`, run as a single-file Java program).
const CURATOR: &str = r#"
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderSelector;
import org.apache.curator.framework.recipes.leader.LeaderSelectorListenerAdapter;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryOneTime;

public class Curator {
    static void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    public static void main(String[] args) throws Exception {
        String hosts = args[0], path = args[1], ident = args[2];
        BufferedReader stdin = new BufferedReader(new InputStreamReader(System.in));
        CuratorFramework client = CuratorFrameworkFactory.newClient(hosts, new RetryOneTime(100));
        client.start();
        client.blockUntilConnected();
        LeaderSelector selector = new LeaderSelector(client, path, new LeaderSelectorListenerAdapter() {
            public void takeLeadership(CuratorFramework c) throws Exception {
                LED.countDown();
                say("LEADING " + leaderOf(SELECTOR[0]));
                stdin.readLine();
            }
        });
        SELECTOR[0] = selector;
        selector.setId(ident);
        say("LEADER " + leaderOf(selector));
        // LeaderSelector's own mutex: the same recipe, with a timeout.
        InterProcessMutex mutex = new InterProcessMutex(client, path);
        if (mutex.acquire(1, TimeUnit.SECONDS)) {
            say("LEADING-WHILE-LED");
            mutex.release();
        } else {
            say("TIMEOUT");
        }
        say("WAITING");
        selector.start();
        // Led once (however briefly: a poll could miss it), then let go.
        LED.await();
        while (selector.hasLeadership()) Thread.sleep(10);
        say("RESIGNED");
        selector.close();
        client.close();
    }

    static final LeaderSelector[] SELECTOR = new LeaderSelector[1];
    static final java.util.concurrent.CountDownLatch LED = new java.util.concurrent.CountDownLatch(1);

    static String leaderOf(LeaderSelector selector) throws Exception {
        return selector.getLeader().getId();
    }
}
"#;

/// The jars the Curator driver needs, from `/usr/share/java`.
const CURATOR_JARS: [&str; 7] = [
    "curator-client",
    "curator-framework",
    "curator-recipes",
    "zookeeper",
    "zookeeper-jute",
    "guava",
    "slf4j-api",
];

/// A foreign client (kazoo, Curator) driven line by line over stdin/stdout.
struct Peer {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    /// The directory of a driver's source file, removed with the peer.
    _source: Option<tempfile::TempDir>,
}

impl Peer {
    /// The kazoo driver above in `mode`, as `ident` on the lock `name`.
    fn kazoo(server: &ZooKeeper, name: &str, ident: &str, mode: &str) -> Peer {
        Self::kazoo_in(server, CHROOT, name, ident, mode, None)
    }

    /// The kazoo driver under `chroot`, with `digest` credentials
    /// (`user:password`) and `CREATOR_ALL_ACL` when given.
    fn kazoo_in(
        server: &ZooKeeper,
        chroot: &str,
        name: &str,
        ident: &str,
        mode: &str,
        digest: Option<&str>,
    ) -> Peer {
        let hosts = format!("{}{chroot}", server.connect_string());
        let child = tokio::process::Command::new("python3")
            .args(["-c", KAZOO, &hosts, &format!("/{name}"), ident, mode])
            .args(digest)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 is needed for the kazoo interop tests (apt-get install python3)");
        Peer::driven(child)
    }

    /// The Curator driver below, as `ident` in the election `name`.
    fn curator(server: &ZooKeeper, name: &str, ident: &str) -> Peer {
        let dir = tempfile::Builder::new()
            .prefix("locksmith-curator-")
            .tempdir()
            .unwrap();
        let source = dir.path().join("Curator.java");
        std::fs::write(&source, CURATOR).unwrap();
        let classpath: Vec<String> = CURATOR_JARS
            .iter()
            .map(|jar| format!("/usr/share/java/{jar}.jar"))
            .collect();
        let hosts = format!("{}{CHROOT}", server.connect_string());
        let child = tokio::process::Command::new("java")
            .args(["-cp", &classpath.join(":")])
            .arg(&source)
            .args([&hosts, &format!("/{name}"), ident])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("java is needed for the Curator interop tests");
        Peer {
            _source: Some(dir),
            ..Peer::driven(child)
        }
    }

    fn driven(mut child: Child) -> Peer {
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Peer {
            child,
            stdin,
            lines,
            _source: None,
        }
    }

    async fn line(&mut self) -> String {
        match timeout(Duration::from_secs(60), self.lines.next_line()).await {
            Ok(Ok(Some(line))) => line,
            other => {
                let status = self.child.try_wait();
                panic!(
                    "the peer said nothing ({other:?}, exit {status:?}); are kazoo (pip install \
                     kazoo) and Curator (apt-get install libcurator-recipes-java) installed?"
                )
            }
        }
    }

    async fn expect(&mut self, word: &str) -> String {
        let line = self.line().await;
        assert!(line.starts_with(word), "expected {word}, got {line:?}");
        line
    }

    async fn go(&mut self) {
        self.stdin.write_all(b"go\n").await.unwrap();
        self.stdin.flush().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kazoo_holds_locksmith_waits() {
    let server = shared().await;
    let client = connect(
        &format!("{}{CHROOT}", server.url()),
        Duration::from_secs(10),
    )
    .await;
    let name = unique("kazoo-holds");
    let mut kazoo = Peer::kazoo(server, &name, "kazoo-holder", "hold");
    kazoo.expect("HELD").await;

    assert!(client
        .lock(name.as_str())
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    let waiter = tokio::spawn({
        let lock = client.lock(name.as_str()).owner("locksmith-waiter");
        async move { lock.acquire().await }
    });
    until(&client, &name, "kazoo holding and locksmith waiting", |i| {
        i.holders.len() == 1 && i.waiters.len() == 1
    })
    .await;
    let info = client.describe(&name).await.unwrap().unwrap();
    assert_eq!(info.holders[0].owner, "kazoo-holder");
    assert_eq!(info.waiters[0].owner, "locksmith-waiter");
    let kazoo_token = info.holders[0].fencing_token.unwrap();
    assert!(!waiter.is_finished());

    kazoo.go().await;
    kazoo.expect("RELEASED").await;
    let guard = timeout(Duration::from_secs(10), waiter)
        .await
        .expect("locksmith gets the lock after kazoo releases it")
        .unwrap()
        .unwrap();
    assert!(guard.fencing_token() > kazoo_token);
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn locksmith_holds_kazoo_waits() {
    let server = shared().await;
    let client = connect(
        &format!("{}{CHROOT}", server.url()),
        Duration::from_secs(10),
    )
    .await;
    let name = unique("locksmith-holds");
    let guard = client
        .lock(name.as_str())
        .owner("locksmith-holder")
        .acquire()
        .await
        .unwrap();
    let mut kazoo = Peer::kazoo(server, &name, "kazoo-waiter", "contend");
    let contenders = kazoo.expect("CONTENDERS").await;
    assert!(contenders.contains("locksmith-holder"), "{contenders}");
    kazoo.expect("TIMEOUT").await;
    kazoo.expect("WAITING").await;
    until(&client, &name, "kazoo waiting", |i| i.waiters.len() == 1).await;
    guard.release().await.unwrap();
    kazoo.expect("ACQUIRED").await;
    assert!(client
        .lock(name.as_str())
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    kazoo.go().await;
    kazoo.expect("RELEASED").await;
    assert!(client
        .lock(name.as_str())
        .try_acquire()
        .await
        .unwrap()
        .is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kazoo_readers_share_with_locksmith_readers() {
    let server = shared().await;
    let client = connect(
        &format!("{}{CHROOT}", server.url()),
        Duration::from_secs(10),
    )
    .await;
    let name = unique("kazoo-read");
    let mut kazoo = Peer::kazoo(server, &name, "kazoo-reader", "read");
    kazoo.expect("HELD").await;
    let read = client
        .rw_lock(name.as_str())
        .read()
        .try_acquire()
        .await
        .unwrap();
    assert!(
        read.is_some(),
        "a kazoo reader and a locksmith reader share"
    );
    assert!(client
        .rw_lock(name.as_str())
        .write()
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    drop(read);
    kazoo.go().await;
    kazoo.expect("RELEASED").await;
    let write = client
        .rw_lock(name.as_str())
        .write()
        .acquire_timeout(Duration::from_secs(10))
        .await;
    assert!(write.is_ok());
}

/// A client whose candidates are named as kazoo's `Election` names them.
async fn kazoo_elections(server: &ZooKeeper) -> Client {
    connect(
        &format!("{}{CHROOT}?elections=kazoo", server.url()),
        Duration::from_secs(10),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kazoo_election_follows_a_locksmith_leader() {
    use futures::StreamExt;
    let server = shared().await;
    let client = kazoo_elections(server).await;
    let name = unique("locksmith-leads");
    let election = client.election(name.as_str());
    let mut leadership = election.campaign("locksmith-leader").await.unwrap();
    let children = raw(server)
        .await
        .list_children(&format!("{CHROOT}/{name}"))
        .await
        .unwrap();
    assert!(
        children.len() == 1 && children[0].contains("__lock__"),
        "a kazoo-named candidate: {children:?}"
    );

    let mut kazoo = Peer::kazoo(server, &name, "kazoo-candidate", "elect");
    let contenders = kazoo.expect("CONTENDERS").await;
    assert_eq!(contenders, "CONTENDERS locksmith-leader");
    kazoo.expect("TIMEOUT").await;
    kazoo.expect("WAITING").await;
    until(&client, &name, "kazoo waiting", |i| {
        i.waiters.len() == 1 && i.waiters[0].owner == "kazoo-candidate"
    })
    .await;
    leadership.proclaim("locksmith-moved").await.unwrap();
    let mut observed = Box::pin(client.election(name.as_str()).observe());
    let leader = observed.next().await.unwrap().unwrap().unwrap();
    assert_eq!(leader.value, "locksmith-moved");

    leadership.resign().await.unwrap();
    let leading = kazoo.expect("LEADING").await;
    assert_eq!(leading, "LEADING kazoo-candidate");
    let next = loop {
        if let Some(next) = observed.next().await.unwrap().unwrap() {
            break next;
        }
    };
    assert_eq!(next.value, "kazoo-candidate");
    assert!(next.fencing_token > leader.fencing_token);
    kazoo.go().await;
    kazoo.expect("RESIGNED").await;
    assert_eq!(observed.next().await.unwrap().unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn locksmith_follows_a_kazoo_leader() {
    let server = shared().await;
    let client = kazoo_elections(server).await;
    let name = unique("kazoo-leads");
    let mut kazoo = Peer::kazoo(server, &name, "kazoo-leader", "elect");
    kazoo.expect("CONTENDERS").await;
    // Nobody else leads: its timed try leads (and resigns) at once.
    kazoo.expect("LEADING-WHILE-LED").await;
    kazoo.expect("WAITING").await;
    let leading = kazoo.expect("LEADING").await;
    assert_eq!(leading, "LEADING kazoo-leader");

    let election = client.election(name.as_str());
    let leader = election.leader().await.unwrap().expect("kazoo leads");
    assert_eq!(leader.value, "kazoo-leader");
    let candidate = tokio::spawn({
        let election = election.clone();
        async move { election.campaign("locksmith-candidate").await }
    });
    until(&client, &name, "locksmith waiting behind kazoo", |i| {
        i.waiters.len() == 1
    })
    .await;
    assert!(!candidate.is_finished(), "elected while kazoo leads");
    kazoo.go().await;
    kazoo.expect("RESIGNED").await;
    let leadership = timeout(Duration::from_secs(10), candidate)
        .await
        .expect("elected once kazoo resigns")
        .unwrap()
        .unwrap();
    assert!(leadership.fencing_token() > leader.fencing_token.unwrap());
    assert_eq!(
        election.leader().await.unwrap().unwrap().value,
        "locksmith-candidate"
    );
    leadership.resign().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn curator_leader_selector_follows_a_locksmith_leader() {
    let server = shared().await;
    let client = connect(
        &format!("{}{CHROOT}", server.url()),
        Duration::from_secs(10),
    )
    .await;
    let name = unique("locksmith-leads-curator");
    let mut leadership = client
        .election(name.as_str())
        .campaign("locksmith-leader")
        .await
        .unwrap();
    let mut curator = Peer::curator(server, &name, "curator-candidate");
    assert_eq!(
        curator.expect("LEADER").await,
        "LEADER locksmith-leader",
        "Curator's getLeader() reads a locksmith leader"
    );
    curator.expect("TIMEOUT").await;
    curator.expect("WAITING").await;
    until(&client, &name, "Curator waiting", |i| {
        i.waiters.len() == 1 && i.waiters[0].owner == "curator-candidate"
    })
    .await;
    leadership.proclaim("locksmith-moved").await.unwrap();
    leadership.resign().await.unwrap();
    assert_eq!(curator.expect("LEADING").await, "LEADING curator-candidate");
    let leader = client
        .election(name.as_str())
        .leader()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(leader.value, "curator-candidate");
    curator.go().await;
    curator.expect("RESIGNED").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn locksmith_follows_a_curator_leader() {
    let server = shared().await;
    let client = connect(
        &format!("{}{CHROOT}", server.url()),
        Duration::from_secs(10),
    )
    .await;
    let name = unique("curator-leads");
    let mut curator = Peer::curator(server, &name, "curator-leader");
    curator.expect("LEADER").await;
    // Nobody else leads: its timed try leads (and resigns) at once.
    curator.expect("LEADING-WHILE-LED").await;
    curator.expect("WAITING").await;
    assert_eq!(curator.expect("LEADING").await, "LEADING curator-leader");

    let election = client.election(name.as_str());
    let leader = election.leader().await.unwrap().expect("Curator leads");
    assert_eq!(leader.value, "curator-leader");
    let candidate = tokio::spawn({
        let election = election.clone();
        async move { election.campaign("locksmith-candidate").await }
    });
    until(&client, &name, "locksmith waiting behind Curator", |i| {
        i.waiters.len() == 1
    })
    .await;
    assert!(!candidate.is_finished(), "elected while Curator leads");
    curator.go().await;
    curator.expect("RESIGNED").await;
    let leadership = timeout(Duration::from_secs(10), candidate)
        .await
        .expect("elected once Curator resigns")
        .unwrap()
        .unwrap();
    assert!(leadership.fencing_token() > leader.fencing_token.unwrap());
    leadership.resign().await.unwrap();
}

/// Digest credentials in the URL: locksmith's nodes (and the chroot it
/// makes) carry the creator-only ACL; kazoo with the same credentials and
/// `CREATOR_ALL_ACL` queues on the same lock; a client with another password
/// or none is refused with NoAuth, and the password shows in no error;
/// `acl=read` lets anyone inspect, not queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn digest_credentials_guard_nodes_with_creator_acls() {
    let server = shared().await;
    let run = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let chroot = format!("/locksmith-acl-{run}");
    let password = "pa:ss@word";
    let url = |user_info: &str| format!("zk://{user_info}@127.0.0.1:{}{chroot}", server.port());
    let client = connect(&url("alice:pa%3Ass%40word"), Duration::from_secs(10)).await;
    let name = "orders/42";
    let guard = client
        .lock(name)
        .owner("locksmith-holder")
        .acquire()
        .await
        .unwrap();

    let alice = zk::Client::connector()
        .with_auth("digest", format!("alice:{password}").as_bytes())
        .connect(&server.connect_string())
        .await
        .unwrap();
    for path in [chroot.clone(), format!("{chroot}/{name}")] {
        let (acl, _) = alice.get_acl(&path).await.unwrap();
        assert_eq!(acl.len(), 1, "{path}: {acl:?}");
        assert_eq!(acl[0].scheme(), "digest", "{path}: {acl:?}");
        assert!(acl[0].id().starts_with("alice:"), "{path}: {acl:?}");
        assert_eq!(acl[0].permission(), zk::Permission::ALL, "{path}: {acl:?}");
    }

    // kazoo with the same credentials waits for locksmith, then holds.
    let digest = format!("alice:{password}");
    let mut kazoo = Peer::kazoo_in(
        server,
        &chroot,
        name,
        "kazoo-waiter",
        "contend",
        Some(&digest),
    );
    kazoo.expect("CONTENDERS").await;
    kazoo.expect("TIMEOUT").await;
    kazoo.expect("WAITING").await;
    until(&client, name, "kazoo waiting", |i| i.waiters.len() == 1).await;
    guard.release().await.unwrap();
    kazoo.expect("ACQUIRED").await;
    assert!(client.lock(name).try_acquire().await.unwrap().is_none());
    kazoo.go().await;
    kazoo.expect("RELEASED").await;

    // Another password is another identity: refused, and no password shows.
    let mallory = connect(&url("alice:not-the-password"), Duration::from_secs(10)).await;
    let refused = mallory.lock(name).try_acquire().await.expect_err("refused");
    let shown = format!("{refused} {refused:?}");
    assert!(matches!(refused, Error::Backend { .. }), "{shown}");
    assert!(shown.contains("ACL refuses"), "{shown}");
    assert!(!shown.contains("not-the-password"), "{shown}");
    // kazoo without credentials is refused too.
    let mut anonymous = Peer::kazoo_in(server, &chroot, name, "kazoo-anon", "refused", None);
    anonymous.expect("NOAUTH").await;

    // acl=anyone opts out; acl=read lets anyone look but not queue.
    let read_url = format!(
        "zk://bob:pw@127.0.0.1:{}{chroot}-read?acl=read",
        server.port()
    );
    let open = connect(&read_url, Duration::from_secs(10)).await;
    let held = open.lock(name).acquire().await.unwrap();
    let anyone = connect(
        &format!("{}{chroot}-read", server.url()),
        Duration::from_secs(10),
    )
    .await;
    let info = anyone.describe(name).await.unwrap().expect("anyone reads");
    assert_eq!(info.holders.len(), 1);
    held.release().await.unwrap();
    // Free now, but anyone may not create a contender.
    let refused = anyone.lock(name).try_acquire().await;
    assert!(
        matches!(refused, Err(Error::Backend { .. })),
        "anyone acquired: {refused:?}"
    );
}

/// ZooKeeper's secure client port, which wants client certificates: `zks://`
/// with the CA and a client certificate locks and hands over; without the
/// certificate, or with a CA that did not sign the server's, no session
/// opens; a missing file is named.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tls_clients_with_certificates_lock_and_hand_over() {
    let server = tokio::task::spawn_blocking(ZooKeeper::start_tls)
        .await
        .unwrap();
    let port = server.secure_port().unwrap();
    let ca = server.ca_cert().unwrap();
    let (cert, key) = server.client_cert("locksmith").unwrap().unwrap();
    let url = |ca: &std::path::Path, identity: bool| {
        let mut url = format!("zks://127.0.0.1:{port}/tls?ca={}", ca.display());
        if identity {
            url += &format!("&cert={}&key={}", cert.display(), key.display());
        }
        url
    };
    let a = connect(&url(&ca, true), Duration::from_secs(10)).await;
    let b = connect(&url(&ca, true), Duration::from_secs(10)).await;
    let name = unique("tls");
    let held = a.lock(name.as_str()).acquire().await.unwrap();
    hands_over(&a, &b, &name, held).await;

    for refused in [url(&ca, false), url(&cert, true)] {
        let connect = timeout(Duration::from_secs(30), Client::connect(&refused));
        match connect.await.expect("a refused connect ends") {
            Err(Error::Backend { .. }) => {}
            other => panic!("{refused} connected: {:?}", other.map(drop)),
        }
    }
    let missing = format!("zks://127.0.0.1:{port}?ca=/nonexistent/ca.pem");
    match Client::connect(&missing).await {
        Err(Error::InvalidUrl { reason, .. }) => {
            assert!(reason.contains("ca=/nonexistent/ca.pem"), "{reason}")
        }
        other => panic!("a missing CA file: {:?}", other.map(drop)),
    }
}

/// A ZooKeeper that requires SASL: `?auth=sasl` authenticates with
/// DIGEST-MD5, the nodes are creator-only for `sasl:alice`, another
/// SASL user is refused by them, and a wrong password or no credentials open
/// no session at all (without the password in the error).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sasl_credentials_authenticate_and_guard_nodes() {
    let users = [("alice", "alice-secret"), ("bob", "bob-secret")];
    let server = tokio::task::spawn_blocking(move || ZooKeeper::start_sasl(&users))
        .await
        .unwrap();
    let url =
        |user_info: &str| format!("zk://{user_info}127.0.0.1:{}/sasl?auth=sasl", server.port());
    let a = connect(&url("alice:alice-secret@"), Duration::from_secs(10)).await;
    let b = connect(&url("alice:alice-secret@"), Duration::from_secs(10)).await;
    let name = "orders/42";
    let held = a.lock(name).acquire().await.unwrap();

    let alice = zk::Client::connector()
        .with_sasl(zk::SaslOptions::digest_md5("alice", "alice-secret"))
        .connect(&server.connect_string())
        .await
        .unwrap();
    for path in ["/sasl".to_owned(), format!("/sasl/{name}")] {
        let (acl, _) = alice.get_acl(&path).await.unwrap();
        assert_eq!(acl.len(), 1, "{path}: {acl:?}");
        assert_eq!((acl[0].scheme(), acl[0].id()), ("sasl", "alice"), "{path}");
    }

    // Alice's second client queues behind the first and takes over.
    hands_over(&a, &b, name, held).await;

    // Bob is authenticated, but the nodes are alice's.
    let bob = connect(&url("bob:bob-secret@"), Duration::from_secs(10)).await;
    let refused = bob.lock(name).try_acquire().await.expect_err("bob refused");
    assert!(refused.to_string().contains("ACL refuses"), "{refused}");

    // A wrong password, or none, opens no session.
    for (user_info, password) in [("alice:not-the-secret@", "not-the-secret"), ("", "")] {
        let refused = if user_info.is_empty() {
            format!("zk://127.0.0.1:{}/sasl", server.port())
        } else {
            url(user_info)
        };
        let connect = timeout(Duration::from_secs(30), Client::connect(&refused));
        match connect.await.expect("a refused connect ends") {
            Err(error @ Error::Backend { .. }) => {
                let shown = format!("{error} {error:?}");
                if !password.is_empty() {
                    assert!(!shown.contains(password), "{shown}");
                    assert!(shown.contains("SASL credentials were refused"), "{shown}");
                }
            }
            other => panic!("{refused} connected: {:?}", other.map(drop)),
        }
    }
}

/// `b` queues for `name`, which `a` holds as `held`; `a` releases, and `b`
/// gets the lock (and releases it).
async fn hands_over(a: &Client, b: &Client, name: &str, held: locksmith::Guard) {
    let waiter = tokio::spawn({
        let lock = b.lock(name);
        async move { lock.acquire().await }
    });
    until(a, name, "b waiting", |i| i.waiters.len() == 1).await;
    held.release().await.unwrap();
    timeout(Duration::from_secs(10), waiter)
        .await
        .expect("b gets the lock")
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
}
