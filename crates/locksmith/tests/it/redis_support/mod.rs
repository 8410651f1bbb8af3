//! Servers and helpers shared by the Redis tests.
#![allow(dead_code)]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use locksmith::{Client, ConnectOptions, LostCause};
use locksmith_testkit::conformance::{Clients, Fault, DISK_SHORT_TTL};
use locksmith_testkit::proxy::{self, Route};
use locksmith_testkit::Redis;

/// Connects the conformance suite's clients to one URL.
pub struct Harness {
    pub url: String,
    /// The servers of `url`, whose keys [`Harness::expire_session`] lets
    /// lapse and in front of which each client gets fault proxies; none
    /// where the client finds servers the URL does not name (Sentinel,
    /// cluster).
    nodes: Vec<&'static Redis>,
    /// Each client's id (the prefix of its holder ids in Redis) and its
    /// proxies, if any.
    clients: Clients<(String, Option<Arc<Route>>)>,
    /// Taken while a client connects, so that clients connect one at a
    /// time. The suite's behaviours run at once, and a client over TLS
    /// makes a handshake per node (Sentinels, primary, every node of a
    /// Cluster), which in a test build costs CPU: dozens at once on a
    /// 2-CPU machine ran past the client's connect timeout (500 ms to a
    /// Sentinel).
    connecting: tokio::sync::Mutex<()>,
    /// How many of the suite's behaviours run at once.
    concurrency: usize,
}

impl Harness {
    /// A harness for `url`, without faults.
    pub fn new(url: impl Into<String>) -> Harness {
        Harness::on(url, Vec::new())
    }

    /// A harness for `url`, whose servers are `nodes`.
    pub fn on(url: impl Into<String>, nodes: Vec<&'static Redis>) -> Harness {
        Harness {
            url: url.into(),
            nodes,
            clients: Clients::default(),
            connecting: tokio::sync::Mutex::new(()),
            concurrency: usize::MAX,
        }
    }

    /// The same harness, running at most `concurrency` of the suite's
    /// behaviours at once.
    pub fn at_most(self, concurrency: usize) -> Harness {
        Harness {
            concurrency,
            ..self
        }
    }
}

/// Lets every lock key held by the client whose holder ids start with
/// `ARGV[1]` lapse (`PEXPIRE 1`): a Redisson hash with its field, a
/// redis-py string with its value. Answers how many.
const LAPSE: &str = r#"
local prefix, cursor, lapsed = ARGV[1], "0", 0
local function ours(s) return string.sub(s, 1, #prefix) == prefix end
repeat
  local page = redis.call('SCAN', cursor, 'COUNT', 1000)
  cursor = page[1]
  for _, key in ipairs(page[2]) do
    local kind = redis.call('TYPE', key).ok
    local held = false
    if kind == 'hash' then
      for _, field in ipairs(redis.call('HKEYS', key)) do
        if ours(field) then held = true end
      end
    elseif kind == 'string' then
      held = ours(redis.call('GET', key))
    end
    if held then
      redis.call('PEXPIRE', key, 1)
      lapsed = lapsed + 1
    end
  end
until cursor == "0"
return lapsed
"#;

impl locksmith_testkit::conformance::Harness for Harness {
    async fn connect(&self, session_ttl: Duration) -> Client {
        let _one_at_a_time = self.connecting.lock().await;
        let route = match self.nodes.is_empty() {
            true => None,
            false => Some(Arc::new(
                Route::start(&self.url).await.expect("fault proxies"),
            )),
        };
        let url = route.as_ref().map_or(self.url.as_str(), |r| r.url());
        let (backend, client) = backend_and_client(url, session_ttl).await;
        let id = backend.client_id().to_owned();
        self.clients.remember(&client, (id, route));
        client
    }

    fn concurrency(&self) -> usize {
        self.concurrency
    }

    /// The test servers sync every write to the disk (`appendfsync always`).
    fn short_ttl(&self) -> Duration {
        DISK_SHORT_TTL
    }

    /// The holder's watchdog finds its key gone.
    fn force_release_causes(&self) -> &'static [LostCause] {
        &[LostCause::Gone]
    }

    /// Redis has no sessions: a client's holds live as long as its
    /// watchdog renews their keys. Their lapse is the session's end; the
    /// watchdog then finds them gone.
    async fn expire_session(&self, client: &Client) -> Fault {
        if self.nodes.is_empty() {
            return Fault::Unsupported;
        }
        let prefix = format!("{}:", self.clients.of(client).0);
        let lapsed: i64 = self
            .nodes
            .iter()
            .map(|node| {
                let lapsed = node.query(&["EVAL", LAPSE, "0", &prefix]);
                lapsed.expect("EVAL").as_int().expect("a count")
            })
            .sum();
        assert!(lapsed > 0, "no key held by the client");
        Fault::Injected(&[LostCause::Gone])
    }

    /// Blackholes the client's proxies: its watchdog's renewals go
    /// unanswered, and it gives its holds up by the end of their lease,
    /// before Redis lets their keys expire.
    async fn cut_connection(&self, client: &Client) -> Fault {
        let Some(route) = self.clients.of(client).1 else {
            return Fault::Unsupported;
        };
        route.set(proxy::Mode::Blackhole);
        Fault::Injected(&[LostCause::ConnectionLost])
    }

    async fn restore_connection(&self, client: &Client) {
        if let Some(route) = self.clients.of(client).1 {
            route.set(proxy::Mode::Pass);
        }
    }
}

/// One Redis for every test that does not inject faults.
pub fn shared_redis() -> &'static Redis {
    static REDIS: OnceLock<Redis> = OnceLock::new();
    REDIS.get_or_init(Redis::start)
}

/// Five Redis masters for the Redlock suite.
pub fn shared_redlock() -> &'static [Redis] {
    static NODES: OnceLock<Vec<Redis>> = OnceLock::new();
    NODES.get_or_init(|| (0..5).map(|_| Redis::start()).collect())
}

/// `redis+redlock://127.0.0.1:p1,…` for these servers.
pub fn redlock_url(nodes: &[Redis]) -> String {
    let hosts: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port()))
        .collect();
    format!("redis+redlock://{}", hosts.join(","))
}

/// A client with the given session TTL.
pub async fn client(url: &str, session_ttl: Duration) -> Client {
    let options = ConnectOptions::default().session_ttl(session_ttl);
    Client::connect_with(url, options)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"))
}

/// `url` with the replica acknowledgement of a conformance suite: 5 s for a
/// replica to acknowledge a grant instead of the default 1 s. With 1 s a
/// Cluster's replica, on a machine running another cluster's suite beside
/// it, acknowledged too late and the suite's acquire failed. The suites are
/// about the lock rules; the tests that kill primaries keep the default.
pub fn suite_url(url: &str) -> String {
    locksmith_testkit::with_query(url, "wait_timeout=5s")
}

/// `url` (a TLS URL that names the CA) with a client certificate for
/// `common_name` signed by that CA.
pub fn with_client_cert(
    url: &str,
    ca: &locksmith_testkit::Certificates,
    common_name: &str,
) -> String {
    let (cert, key) = ca.client(common_name).expect("a client certificate");
    format!(
        "{url}&tls_cert={}&tls_key={}",
        cert.display(),
        key.display()
    )
}

/// Connecting to `url` fails with a backend error (the server refused or
/// could not be reached), not another kind of error; answers its message.
pub async fn refused(url: &str) -> String {
    match Client::connect(url).await {
        Ok(_) => panic!("{url} was let in"),
        Err(error @ locksmith::Error::Backend { .. }) => error.to_string(),
        Err(other) => panic!("{url}: expected a backend error, got {other:?}"),
    }
}

/// A lock name no other test uses.
pub fn unique(test: &str) -> String {
    format!(
        "redis-test/{test}/{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

/// Polls `check` every 10 ms until it holds, or panics after `limit`.
pub async fn eventually(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let started = tokio::time::Instant::now();
    while !check() {
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A raw connection for looking at keys directly.
pub async fn raw(redis: &Redis) -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

pub mod redisson;

/// A `RedisBackend` kept at hand next to the client made from it.
pub async fn backend_and_client(
    url: &str,
    session_ttl: Duration,
) -> (std::sync::Arc<locksmith::redis::RedisBackend>, Client) {
    let options = ConnectOptions::default().session_ttl(session_ttl);
    let backend = std::sync::Arc::new(
        locksmith::redis::RedisBackend::connect(url, &options)
            .await
            .unwrap_or_else(|e| panic!("connect {url}: {e}")),
    );
    let client = Client::from_backend(backend.clone());
    (backend, client)
}

/// A child process whose stdout lines arrive on a channel.
pub struct ChildLines {
    pub child: std::process::Child,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
}

impl ChildLines {
    /// Takes over `child`'s stdout.
    pub fn new(mut child: std::process::Child) -> ChildLines {
        let stdout = child.stdout.take().expect("piped stdout");
        let (sender, lines) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        ChildLines { child, lines }
    }

    /// The next line, or a panic after `limit`.
    pub async fn next(&mut self, limit: Duration) -> String {
        match tokio::time::timeout(limit, self.lines.recv()).await {
            Ok(Some(line)) => line,
            Ok(None) => panic!("child exited: {:?}", self.child.wait()),
            Err(_) => panic!("child printed nothing within {limit:?}"),
        }
    }

    /// Sends a line to the child's stdin.
    pub fn send(&mut self, line: &str) {
        use std::io::Write;
        let stdin = self.child.stdin.as_mut().expect("piped stdin");
        writeln!(stdin, "{line}").expect("write child stdin");
        stdin.flush().expect("flush child stdin");
    }
}

impl Drop for ChildLines {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a Python snippet with redis-py; it talks in lines on stdin/stdout.
pub fn python(code: &str) -> ChildLines {
    let check = std::process::Command::new("python3")
        .args(["-c", "import redis"])
        .status()
        .expect("python3 not found: install Python 3 (scripts/test does)");
    assert!(
        check.success(),
        "redis-py is missing: `pip install redis` (scripts/test installs it)"
    );
    ChildLines::new(
        std::process::Command::new("python3")
            .args(["-u", "-c", code])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("spawn python3"),
    )
}
