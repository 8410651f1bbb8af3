//! The conformance suite and etcd-specific tests (interop with `etcdctl lock`,
//! fencing, layout, restarts) against a real `etcd`, one server per test
//! binary. The suite's harness revokes a client's lease and cuts its
//! connection (its own fault proxies).

use std::process::Stdio;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use locksmith::etcd::rpc::{self, etcdserverpb::Compare, etcdserverpb::TxnRequest};
use locksmith::etcd::EtcdBackend;
use locksmith::{Client, ConnectOptions, Error, Guard, LostCause, Mode};
use locksmith_testkit::conformance::{self, Clients, Fault, DISK_SHORT_TTL};
use locksmith_testkit::proxy::{self, Route};
use locksmith_testkit::Etcd;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout};

/// One etcd for the whole binary (it dies with the test process).
fn etcd() -> &'static Etcd {
    static ETCD: OnceLock<Etcd> = OnceLock::new();
    ETCD.get_or_init(Etcd::start)
}

/// The suite's harness: clients of the shared etcd, each through fault
/// proxies of its own and on a backend the harness keeps, to reach its
/// session lease for faults.
struct Harness {
    url: String,
    clients: Clients<(Weak<EtcdBackend>, Arc<Route>)>,
}

impl conformance::Harness for Harness {
    async fn connect(&self, session_ttl: Duration) -> Client {
        let route = Route::start(&self.url).await.expect("fault proxies");
        let (backend, client) = etcd_backend(route.url(), session_ttl).await;
        self.clients
            .remember(&client, (Arc::downgrade(&backend), Arc::new(route)));
        client
    }

    /// etcd's leases are whole seconds, 2 s at least by default, and their
    /// keep-alives are commits.
    fn short_ttl(&self) -> Duration {
        DISK_SHORT_TTL
    }

    /// The holder sees its key deleted.
    fn force_release_causes(&self) -> &'static [LostCause] {
        &[LostCause::Gone]
    }

    /// Revokes the client's session lease, as its expiry would.
    async fn expire_session(&self, client: &Client) -> Fault {
        let backend = self.clients.of(client).0.upgrade().expect("a live client");
        let lease = format!("{:x}", backend.session_lease());
        let out = etcd()
            .etcdctl()
            .args(["lease", "revoke", &lease])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        // Whichever the client sees first: the lease's end, or its key's
        // deletion (which the revoke makes).
        Fault::Injected(&[LostCause::SessionExpired, LostCause::Gone])
    }

    /// Blackholes the client's proxies: its keep-alives go unanswered, and
    /// it gives its holds up before the lease can end on the server.
    async fn cut_connection(&self, client: &Client) -> Fault {
        self.clients.of(client).1.set(proxy::Mode::Blackhole);
        Fault::Injected(&[LostCause::ConnectionLost])
    }

    async fn restore_connection(&self, client: &Client) {
        self.clients.of(client).1.set(proxy::Mode::Pass);
    }
}

async fn harness() -> Harness {
    Harness {
        url: etcd().url(),
        clients: Clients::default(),
    }
}

locksmith_testkit::conformance_suite!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    harness()
);

/// A lock name no other test uses.
fn unique(test: &str) -> String {
    format!(
        "etcd-tests/{}/{test}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

/// A client plus its concrete backend, for the etcd-specific helpers.
async fn etcd_backend(url: &str, session_ttl: Duration) -> (Arc<EtcdBackend>, Client) {
    let options = ConnectOptions::default().session_ttl(session_ttl);
    let backend = Arc::new(EtcdBackend::connect(url, &options).await.expect("connect"));
    (backend.clone(), Client::from_backend(backend))
}

/// Keys under `prefix`, as etcdctl sees them.
fn etcdctl_keys(prefix: &str) -> Vec<String> {
    let out = etcd()
        .etcdctl()
        .args(["get", "--prefix", "--keys-only", prefix])
        .output()
        .expect("etcdctl get");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Waits (observing, not guessing) until `check` holds for the lock's description.
async fn until(
    client: &Client,
    name: &str,
    what: &str,
    check: impl Fn(&locksmith::LockInfo) -> bool,
) {
    for _ in 0..500 {
        if let Some(info) = client.describe(name).await.expect("describe") {
            if check(&info) {
                return;
            }
        }
        sleep(Duration::from_millis(20)).await;
    }
    panic!("{name}: never saw {what}");
}

/// An acquire of `name` by `client`, once it waits in the queue.
async fn queued(client: &Client, name: &str) -> JoinHandle<locksmith::Result<Guard>> {
    let waiter = tokio::spawn({
        let lock = client.lock(name);
        async move { lock.acquire().await }
    });
    until(client, name, "a waiter", |info| info.waiters.len() == 1).await;
    waiter
}

/// Releases `held`; the `waiter` must then get the lock within `within`, with
/// a higher token, and releases it too.
async fn hand_over(held: Guard, waiter: JoinHandle<locksmith::Result<Guard>>, within: Duration) {
    let token = held.fencing_token();
    held.release().await.unwrap();
    let next = timeout(within, waiter)
        .await
        .expect("the waiter is granted the released lock")
        .unwrap()
        .unwrap();
    assert!(next.fencing_token() > token);
    next.release().await.unwrap();
}

fn terminate(child: &tokio::process::Child) {
    signal(child, "-TERM");
}

/// Sends SIGINT, on which `etcdctl elect` resigns (or stops observing) and exits.
fn interrupt(child: &tokio::process::Child) {
    signal(child, "-INT");
}

fn signal(child: &tokio::process::Child, signal: &str) {
    let pid = child.id().expect("running").to_string();
    let status = std::process::Command::new("kill")
        .args([signal, &pid])
        .status()
        .expect("kill");
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lock_excludes_locksmith() {
    let name = unique("etcdctl-holds");
    let client = Client::connect(&etcd().url()).await.unwrap();
    // `etcdctl lock <name>` without a command prints its key once it holds,
    // then holds until SIGTERM, when it unlocks.
    let mut etcdctl = tokio::process::Command::from(etcd().etcdctl());
    let mut holder = etcdctl
        .args(["lock", &name])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("etcdctl lock");
    let mut lines = BufReader::new(holder.stdout.take().unwrap()).lines();
    let key = timeout(Duration::from_secs(10), lines.next_line())
        .await
        .expect("etcdctl acquires a free lock")
        .unwrap()
        .expect("etcdctl prints its key");
    let lease_hex = key
        .strip_prefix(&format!("{name}/"))
        .expect("etcdctl's key is <name>/<lease hex>");
    assert!(i64::from_str_radix(lease_hex, 16).is_ok(), "{key}");

    assert!(client
        .lock(name.as_str())
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    let waiter = tokio::spawn({
        let lock = client.lock(name.as_str()).owner("rust");
        async move { lock.acquire().await }
    });
    until(&client, &name, "etcdctl holding and us waiting", |info| {
        info.holders.len() == 1 && info.holders[0].owner == lease_hex && info.waiters.len() == 1
    })
    .await;
    let etcdctl_token = client.describe(&name).await.unwrap().unwrap().holders[0]
        .fencing_token
        .unwrap();
    assert!(!waiter.is_finished(), "granted while etcdctl holds");

    terminate(&holder);
    let guard = timeout(Duration::from_secs(10), waiter)
        .await
        .expect("granted once etcdctl unlocks")
        .unwrap()
        .unwrap();
    assert!(guard.fencing_token() > etcdctl_token);
    assert!(holder.wait().await.unwrap().success());
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locksmith_excludes_etcdctl_lock() {
    let name = unique("locksmith-holds");
    let client = Client::connect(&etcd().url()).await.unwrap();
    let guard = client.lock(name.as_str()).acquire().await.unwrap();

    let mut etcdctl = tokio::process::Command::from(etcd().etcdctl());
    let mut contender = etcdctl
        .args([
            "lock",
            &name,
            "--",
            "sh",
            "-c",
            "echo \"$ETCD_LOCK_KEY $ETCD_LOCK_REV\"",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("etcdctl lock");
    until(&client, &name, "etcdctl queued behind us", |info| {
        info.holders.len() == 1 && info.waiters.len() == 1
    })
    .await;
    assert!(
        contender.try_wait().unwrap().is_none(),
        "etcdctl ran its command while we hold the lock"
    );
    let holding = guard.fencing_token();
    guard.release().await.unwrap();

    let output = timeout(Duration::from_secs(10), contender.wait_with_output())
        .await
        .expect("etcdctl gets the lock once we release")
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let (key, revision) = stdout.trim().split_once(' ').expect("key and revision");
    assert!(key.starts_with(&format!("{name}/")), "{key}");
    assert!(revision.parse::<u64>().unwrap() > holding);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_transactions_reject_a_former_holder() {
    let name = unique("fence");
    let (backend_a, a) = etcd_backend(&etcd().url(), Duration::from_secs(30)).await;
    let (backend_b, b) = etcd_backend(&etcd().url(), Duration::from_secs(30)).await;
    let data = format!("{name}-data");
    let write = |compare: Compare, value: &'static str| {
        let data = data.clone();
        let etcd = backend_a.etcd_client();
        async move {
            let txn = TxnRequest {
                compare: vec![compare],
                success: vec![rpc::put(data, value, 0).into()],
                failure: Vec::new(),
            };
            etcd.txn(txn).await.unwrap().succeeded
        }
    };

    let first = a.lock(name.as_str()).acquire().await.unwrap();
    let first_fence = backend_a.fenced_compare(&first).unwrap();
    assert!(write(first_fence.clone(), "first").await);
    first.release().await.unwrap();
    assert!(matches!(
        backend_a.fenced_compare(&b.lock(name.as_str()).acquire().await.unwrap()),
        Err(Error::NotHeld { .. })
    ));

    let second = b.lock(name.as_str()).acquire().await.unwrap();
    let second_fence = backend_b.fenced_compare(&second).unwrap();
    assert!(
        !write(first_fence, "stale").await,
        "a former holder's write landed"
    );
    assert!(write(second_fence, "second").await);
    let key = backend_b
        .holder_key(&name, second.fencing_token())
        .expect("our key");
    assert!(write(locksmith::etcd::fence(key, second.fencing_token()), "again").await);
    second.release().await.unwrap();

    let value = backend_a.etcd_client().range(rpc::get(data)).await.unwrap();
    assert_eq!(value.kvs[0].value, b"again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_follow_the_go_mutex_layout() {
    let name = unique("layout");
    let (backend, client) = etcd_backend(&etcd().url(), Duration::from_secs(30)).await;
    let lease = format!("{:x}", backend.session_lease());
    let first = client.lock(name.as_str()).acquire().await.unwrap();
    assert_eq!(etcdctl_keys(&name), [format!("{name}/{lease}")]);
    assert_eq!(
        backend.holder_key(&name, first.fencing_token()),
        Some(format!("{name}/{lease}"))
    );
    // A second owner of the same client needs a key of its own.
    let second = tokio::spawn({
        let lock = client.lock(name.as_str());
        async move { lock.acquire().await }
    });
    until(&client, &name, "a second contender", |info| {
        info.waiters.len() == 1
    })
    .await;
    let keys = etcdctl_keys(&name);
    assert_eq!(keys.len(), 2);
    assert!(keys.contains(&format!("{name}/{lease}_1")), "{keys:?}");
    first.release().await.unwrap();
    second.await.unwrap().unwrap().release().await.unwrap();
    assert!(etcdctl_keys(&name).is_empty());

    // Readers use the recipe RWMutex's reader prefix.
    let reader = client
        .rw_lock(name.as_str())
        .read()
        .acquire()
        .await
        .unwrap();
    assert_eq!(etcdctl_keys(&name), [format!("{name}/read/{lease}")]);
    reader.release().await.unwrap();

    // A namespace is opt-in, and lands where etcdctl's `lock <ns>/<name>` looks.
    let (namespaced, client) = etcd_backend(
        &format!("{}?prefix=ns-test", etcd().url()),
        Duration::from_secs(30),
    )
    .await;
    let held = client.lock(name.as_str()).acquire().await.unwrap();
    let lease = format!("{:x}", namespaced.session_lease());
    assert_eq!(
        etcdctl_keys(&format!("ns-test/{name}")),
        [format!("ns-test/{name}/{lease}")]
    );
    // Listing through the namespace shows names without it.
    let listed: Vec<String> = client
        .list("")
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.name)
        .collect();
    assert_eq!(listed, [name.as_str()]);
    held.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_names_are_separate_locks() {
    let outer = unique("nested");
    let inner = format!("{outer}/inner");
    let client = Client::connect(&etcd().url()).await.unwrap();
    let held = client.lock(inner.as_str()).acquire().await.unwrap();
    let other = client.lock(outer.as_str()).try_acquire().await.unwrap();
    assert!(other.is_some(), "lock {inner} blocked lock {outer}");
    // Listing tells them apart.
    let listed: Vec<String> = client
        .list(&outer)
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.name)
        .collect();
    assert_eq!(listed, [outer.as_str(), inner.as_str()]);
    other.unwrap().release().await.unwrap();
    held.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_values_record_permits() {
    let name = unique("sem-meta");
    let client = Client::connect(&etcd().url()).await.unwrap();
    let permit = client.semaphore(name.as_str(), 4).acquire().await.unwrap();
    let etcd = etcd_backend(&etcd().url(), Duration::from_secs(30))
        .await
        .0
        .etcd_client();
    let got = etcd.range(rpc::prefix(&format!("{name}/"))).await.unwrap();
    let value = std::str::from_utf8(&got.kvs[0].value).unwrap();
    assert!(value.starts_with("locksmith/1\n"), "{value}");
    assert!(value.contains("\nmode=semaphore/4\n"), "{value}");
    let info = client.describe(&name).await.unwrap().unwrap();
    assert_eq!(info.holders[0].mode, Mode::Semaphore { permits: 4 });
    assert!(info.holders[0].lease_expires.is_some());
    permit.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_delay_is_refused() {
    let client = Client::connect(&etcd().url()).await.unwrap();
    let result = client
        .lock(unique("delay"))
        .lock_delay(Duration::from_secs(1))
        .try_acquire()
        .await;
    assert!(
        matches!(result, Err(Error::Unsupported { .. })),
        "{result:?}"
    );
}

/// Faults that stop or restart the server get an etcd of their own, so that
/// the tests sharing the binary's server are not disturbed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_survive_an_etcd_restart() {
    let own = tokio::task::block_in_place(Etcd::start);
    let name = unique("restart");
    let options = ConnectOptions::default().session_ttl(Duration::from_secs(10));
    let a = Client::connect_with(&own.url(), options.clone())
        .await
        .unwrap();
    let b = Client::connect_with(&own.url(), options).await.unwrap();
    let held = a.lock(name.as_str()).acquire().await.unwrap();
    let waiter = queued(&b, &name).await;

    tokio::task::block_in_place(|| own.restart());

    // The lease outlives the restart (etcd persists leases) and the keep-alive
    // and the watches reconnect: still held, the waiter still queued.
    until(&b, &name, "the queue back after the restart", |info| {
        info.holders.len() == 1 && info.waiters.len() == 1
    })
    .await;
    assert!(!held.is_lost(), "{:?}", held.lost_signal().reason());
    // The waiter is woken after the restart.
    hand_over(held, waiter, Duration::from_secs(20)).await;
}

/// etcd with authentication on: the client logs in with the URL's user and
/// sends the token on every call (keys, leases, watches); a wrong password
/// fails the connect without showing the password, and a client without
/// credentials is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authenticated_clients_lock_and_hand_over() {
    let own = tokio::task::block_in_place(Etcd::start_auth);
    let password = Etcd::ROOT_PASSWORD;
    let url = format!("etcd://root:{password}@127.0.0.1:{}", own.port());
    let name = unique("auth");
    let a = Client::connect(&url).await.unwrap();
    let b = Client::connect(&url).await.unwrap();
    let held = a.lock(name.as_str()).acquire().await.unwrap();
    // b's watch sees the release.
    hand_over(held, queued(&b, &name).await, Duration::from_secs(10)).await;

    let wrong = format!("etcd://root:not-{password}@127.0.0.1:{}", own.port());
    let error = Client::connect(&wrong)
        .await
        .expect_err("a wrong password connected");
    assert!(matches!(error, Error::Backend { .. }), "{error:?}");
    let shown = format!("{error} {error:?}");
    assert!(shown.contains("authentication failed"), "{shown}");
    assert!(!shown.contains(password), "the password shows: {shown}");
    // Without the token etcd refuses the key (so the clients above sent it).
    let anonymous = Client::connect(&format!("etcd://127.0.0.1:{}", own.port()))
        .await
        .unwrap();
    let refused = anonymous.lock(name.as_str()).try_acquire().await;
    assert!(matches!(refused, Err(Error::Backend { .. })), "{refused:?}");
    // Nor does a URL the backend refuses show the password.
    let bad = format!("etcd://root:{password}@127.0.0.1:{}?nope=1", own.port());
    let error = Client::connect(&bad).await.expect_err("an unknown option");
    let shown = format!("{error} {error:?}");
    assert!(!shown.contains(password), "the password shows: {shown}");
}

/// etcd forgets a token left unused for its TTL (1 s on the testkit's
/// etcd): the client logs in again by itself and carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_token_is_renewed_by_logging_in_again() {
    let own = tokio::task::block_in_place(Etcd::start_auth);
    let url = format!(
        "etcd://root:{}@127.0.0.1:{}",
        Etcd::ROOT_PASSWORD,
        own.port()
    );
    // Keep-alives every 10 s: the token idles past its TTL meanwhile.
    let options = ConnectOptions::default().session_ttl(Duration::from_secs(30));
    let client = Client::connect_with(&url, options).await.unwrap();
    let name = unique("relogin");
    let first = client.lock(name.as_str()).acquire().await.unwrap();
    first.release().await.unwrap();
    // etcd's token TTL is a server-side timer: outlast it.
    sleep(Duration::from_secs(3)).await;
    let again = timeout(
        Duration::from_secs(20),
        client.lock(name.as_str()).acquire(),
    )
    .await
    .expect("an acquire after the token expired ends")
    .expect("the client logs in again");
    assert!(client.describe(&name).await.unwrap().is_some());
    again.release().await.unwrap();
}

/// A TLS-only etcd that wants client certificates (`--client-cert-auth`):
/// `etcds://` with the CA and a client certificate locks and hands over;
/// without the certificate, with a CA that did not sign the server's, or
/// over plain `etcd://`, nothing is let through; a missing file is named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_clients_with_certificates_lock_and_hand_over() {
    let own = tokio::task::block_in_place(Etcd::start_tls);
    let (cert, key) = own.client_cert("locksmith").unwrap().unwrap();
    let url = format!(
        "{}&cert={}&key={}",
        own.url(),
        cert.display(),
        key.display()
    );
    let name = unique("tls");
    let a = Client::connect(&url).await.unwrap();
    let b = Client::connect(&url).await.unwrap();
    let held = a.lock(name.as_str()).acquire().await.unwrap();
    hand_over(held, queued(&b, &name).await, Duration::from_secs(10)).await;
    // etcdctl (TLS too) sees locksmith's key layout.
    let out = own
        .etcdctl()
        .args(["get", "--prefix", &name, "--keys-only"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");

    let refused = |url: String| async move {
        let connect = timeout(Duration::from_secs(20), Client::connect(&url));
        match connect.await.expect("a refused connect ends") {
            Err(Error::Backend { .. }) => {}
            other => panic!("{url} connected: {:?}", other.map(drop)),
        }
    };
    // The server wants a client certificate.
    refused(own.url()).await;
    // A certificate that is no CA of the server's.
    let port = own.port();
    let (ca, key) = (cert.display(), key.display());
    refused(format!(
        "etcds://127.0.0.1:{port}?ca={ca}&cert={ca}&key={key}"
    ))
    .await;
    // Plain HTTP/2 to a TLS port.
    refused(format!("etcd://127.0.0.1:{port}")).await;

    match Client::connect(&format!("etcds://127.0.0.1:{port}?ca=/nonexistent/ca.pem")).await {
        Err(Error::InvalidUrl { reason, .. }) => {
            assert!(reason.contains("ca=/nonexistent/ca.pem"), "{reason}")
        }
        other => panic!("a missing CA file: {:?}", other.map(drop)),
    }
}

/// With one member of a 3-member cluster down (killed, not the leader), the
/// majority serves, and so must the client: no call may fail because the
/// balanced channel picked the dead member's endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_down_fails_no_call() {
    use locksmith_testkit::EtcdCluster;
    let cluster = tokio::task::spawn_blocking(EtcdCluster::start)
        .await
        .unwrap();
    let client = Client::connect(&cluster.url()).await.expect("connect");
    let leader = cluster.leader().expect("a leader").port();
    let down = cluster
        .members()
        .iter()
        .find(|m| m.port() != leader)
        .expect("a follower");
    down.kill();
    let mut failures = Vec::new();
    for round in 0..30 {
        let name = unique(&format!("member-down-{round}"));
        let outcome = async {
            let guard = client.lock(name.as_str()).acquire().await?;
            client.describe(&name).await?;
            guard.release().await
        }
        .await;
        if let Err(error) = outcome {
            failures.push(format!("round {round}: {error}"));
        }
    }
    client.close().await.unwrap();
    assert!(
        failures.is_empty(),
        "calls failed with one member down:\n{}",
        failures.join("\n")
    );
}

/// The next line a child printed, within ten seconds.
async fn next_line(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    what: &str,
) -> String {
    timeout(Duration::from_secs(10), lines.next_line())
        .await
        .unwrap_or_else(|_| panic!("etcdctl never printed {what}"))
        .unwrap()
        .unwrap_or_else(|| panic!("etcdctl ended before printing {what}"))
}

/// `etcdctl elect <args>` with its output piped.
fn etcdctl_elect(args: &[&str]) -> tokio::process::Child {
    tokio::process::Command::from(etcd().etcdctl())
        .arg("elect")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("etcdctl elect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_elect_leads_and_locksmith_follows() {
    use futures::StreamExt;
    let name = unique("etcdctl-leads");
    let client = Client::connect(&etcd().url()).await.unwrap();
    // `etcdctl elect NAME VALUE` prints its key and value once it leads, then
    // leads until SIGINT, when it resigns.
    let mut etcdctl = etcdctl_elect(&[&name, "etcd candidate"]);
    let mut lines = BufReader::new(etcdctl.stdout.take().unwrap()).lines();
    let key = next_line(&mut lines, "its key").await;
    assert!(key.starts_with(&format!("{name}/")), "{key}");
    assert_eq!(next_line(&mut lines, "its value").await, "etcd candidate");

    let election = client.election(name.as_str());
    let mut observed = Box::pin(election.observe());
    let leader = observed.next().await.unwrap().unwrap().expect("a leader");
    assert_eq!(
        leader.value, "etcd candidate",
        "the key's value is the proposal"
    );
    let candidate = tokio::spawn({
        let election = election.clone();
        async move { election.campaign("rust candidate").await }
    });
    until(&client, &name, "us waiting behind etcdctl", |info| {
        info.waiters.len() == 1
    })
    .await;
    assert!(!candidate.is_finished(), "elected while etcdctl leads");

    interrupt(&etcdctl);
    let leadership = timeout(Duration::from_secs(10), candidate)
        .await
        .expect("elected once etcdctl resigns")
        .unwrap()
        .unwrap();
    assert!(leadership.fencing_token() > leader.fencing_token.unwrap());
    let next = loop {
        if let Some(next) = observed.next().await.unwrap().unwrap() {
            break next;
        }
    };
    assert_eq!(next.value, "rust candidate");
    assert!(etcdctl.wait().await.unwrap().success());
    leadership.resign().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locksmith_leads_and_etcdctl_follows() {
    let name = unique("locksmith-leads");
    let (backend, client) = etcd_backend(&etcd().url(), Duration::from_secs(10)).await;
    let mut leadership = client
        .election(name.as_str())
        .campaign("first")
        .await
        .unwrap();
    // Go's layout: `<name>/<lease hex>`, holding the value itself.
    let key = format!("{name}/{:x}", backend.session_lease());
    assert_eq!(etcdctl_keys(&name), std::slice::from_ref(&key));

    // `etcdctl elect -l NAME` prints the leader's key and value, and again
    // at every change.
    let mut observer = etcdctl_elect(&["-l", &name]);
    let mut observed = BufReader::new(observer.stdout.take().unwrap()).lines();
    assert_eq!(next_line(&mut observed, "the leader's key").await, key);
    assert_eq!(
        next_line(&mut observed, "the leader's value").await,
        "first"
    );
    leadership.proclaim("second").await.unwrap();
    assert_eq!(next_line(&mut observed, "the key again").await, key);
    assert_eq!(next_line(&mut observed, "the new value").await, "second");

    let mut candidate = etcdctl_elect(&[&name, "etcd next"]);
    let mut elected = BufReader::new(candidate.stdout.take().unwrap()).lines();
    until(&client, &name, "etcdctl waiting behind us", |info| {
        info.waiters.len() == 1 && info.waiters[0].owner == "etcd next"
    })
    .await;
    leadership.resign().await.unwrap();
    let etcd_key = next_line(&mut elected, "its key once elected").await;
    assert_eq!(next_line(&mut elected, "its value").await, "etcd next");
    assert_eq!(next_line(&mut observed, "the next leader").await, etcd_key);
    assert_eq!(next_line(&mut observed, "its value").await, "etcd next");
    let leader = client
        .election(name.as_str())
        .leader()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(leader.value, "etcd next");
    interrupt(&candidate);
    interrupt(&observer);
    assert!(candidate.wait().await.unwrap().success());
    observer.wait().await.unwrap();
}
