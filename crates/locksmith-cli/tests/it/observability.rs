//! Seeing the locks, against a real `locksmith serve` process: `/metrics`
//! scraped during a workload (and parsed as Prometheus text), health and
//! readiness, the grant history, the web page in headless Chromium,
//! `locksmith status --json`, `serve --config`, completions and the man page;
//! and that a command using a lock prints its own output only.

use crate::server_support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use locksmith_proto::v1 as pb;
use locksmith_testkit::free_port;
use server_support::{
    eventually, get, metric, scrape, unique, value, RawSession, ServerProcess, BINARY,
};

/// A server with its HTTP listener on a free port, ready (`/readyz`);
/// returns it and that port.
async fn server_with_http(extra: &[&str]) -> (ServerProcess, u16) {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut args = vec!["--metrics-listen", listen.as_str()];
    args.extend_from_slice(extra);
    let server = ServerProcess::start_with(&args);
    eventually(Duration::from_secs(30), "the server is ready", || async {
        get(port, "/readyz").await.0 == 200
    })
    .await;
    (server, port)
}

#[tokio::test]
async fn metrics_follow_a_workload() {
    let (server, http) = server_with_http(&[]).await;
    let name = unique("metrics");
    let before = scrape(http).await;
    for family in [
        "locksmith_holds",
        "locksmith_waiters",
        "locksmith_sessions",
        "locksmith_fencing_token_high_water",
        "locksmith_grants_total",
        "locksmith_releases_total",
    ] {
        assert_eq!(value(&before, family, &[]), 0.0, "{family}");
    }

    // A hold: granted, in the gauge, its session counted.
    let first = server.client(Duration::from_secs(10)).await;
    let guard = first.lock(name.as_str()).acquire().await.expect("acquire");
    let scraped = scrape(http).await;
    assert_eq!(value(&scraped, "locksmith_grants_total", &[]), 1.0);
    assert_eq!(value(&scraped, "locksmith_holds", &[]), 1.0);
    // A server alone is the leader of its group, and the grant's entry is
    // committed and applied.
    assert_eq!(
        value(&scraped, "locksmith_raft_role", &[("role", "leader")]),
        1.0
    );
    assert_eq!(
        value(&scraped, "locksmith_raft_role", &[("role", "follower")]),
        0.0
    );
    assert!(value(&scraped, "locksmith_raft_term", &[]) >= 1.0);
    let applied = value(&scraped, "locksmith_raft_applied_index", &[]);
    assert!(applied >= 1.0, "{applied}");
    assert!(value(&scraped, "locksmith_raft_commit_index", &[]) >= applied);
    assert_eq!(
        value(
            &scraped,
            "locksmith_raft_replication_lag",
            &[("member", "1")]
        ),
        0.0
    );
    assert_eq!(value(&scraped, "locksmith_sessions", &[]), 1.0);
    assert_eq!(
        value(&scraped, "locksmith_fencing_token_high_water", &[]),
        guard.fencing_token() as f64
    );
    assert!(value(&scraped, "locksmith_commit_duration_seconds_count", &[]) >= 1.0);
    // Observed once the batch's replies are out, so possibly just after ours.
    eventually(Duration::from_secs(10), "the acquire is timed", || async {
        let kind = [("kind", "acquire")];
        metric(http, "locksmith_request_duration_seconds_count", &kind).await >= 1.0
    })
    .await;

    // A waiter: queued, in the gauge.
    let second = server.client(Duration::from_secs(10)).await;
    let waiting = tokio::spawn({
        let lock = second.lock(name.as_str());
        async move { lock.acquire().await }
    });
    eventually(Duration::from_secs(10), "the waiter is queued", || async {
        metric(http, "locksmith_waiters", &[]).await == 1.0
    })
    .await;
    assert_eq!(metric(http, "locksmith_queued_total", &[]).await, 1.0);

    // The release hands the lock over: one release, one more grant, one wait.
    guard.release().await.expect("release");
    let next = waiting
        .await
        .expect("task")
        .expect("granted after the release");
    let scraped = scrape(http).await;
    assert_eq!(value(&scraped, "locksmith_releases_total", &[]), 1.0);
    assert_eq!(value(&scraped, "locksmith_grants_total", &[]), 2.0);
    assert_eq!(value(&scraped, "locksmith_holds", &[]), 1.0);
    assert_eq!(value(&scraped, "locksmith_waiters", &[]), 0.0);
    assert_eq!(
        value(&scraped, "locksmith_wait_duration_seconds_count", &[]),
        1.0
    );

    // A session that stops heartbeating: it expires, and its hold counts as
    // lost by that reason.
    let mut raw = RawSession::open(server.port(), 300).await;
    let other = unique("metrics-expired");
    raw.request(
        1,
        pb::request::Op::Acquire(pb::Acquire {
            names: vec![other.clone()],
            owner: "raw".into(),
            ..Default::default()
        }),
    );
    assert!(matches!(raw.reply(1).await, pb::reply::Result::Granted(_)));
    assert_eq!(metric(http, "locksmith_sessions", &[]).await, 3.0);
    eventually(Duration::from_secs(10), "the session expires", || async {
        metric(
            http,
            "locksmith_lost_total",
            &[("reason", "session_expired")],
        )
        .await
            == 1.0
    })
    .await;
    let scraped = scrape(http).await;
    assert_eq!(
        value(&scraped, "locksmith_expiries_total", &[("what", "session")]),
        1.0
    );
    assert_eq!(value(&scraped, "locksmith_sessions", &[]), 2.0);
    assert_eq!(value(&scraped, "locksmith_holds", &[]), 1.0);
    assert_eq!(
        value(
            &scraped,
            "locksmith_lost_total",
            &[("reason", "lease_expired")]
        ),
        0.0
    );

    // The grant history tells the same story.
    let history = first.history(&name).await.expect("history");
    let ends: Vec<(u64, &locksmith::HoldEnd)> = history
        .iter()
        .filter(|g| g.name == name)
        .map(|g| (g.fencing_token, &g.end))
        .collect();
    assert!(
        matches!(
            ends.as_slice(),
            [(_, locksmith::HoldEnd::Released { .. }), (t, locksmith::HoldEnd::Held)]
                if *t == next.fencing_token()
        ),
        "{history:?}"
    );
    let expired = first.history(&other).await.expect("history");
    assert!(
        matches!(
            expired.as_slice(),
            [g] if matches!(&g.end, locksmith::HoldEnd::Lost { reason, .. } if reason == "session expired")
        ),
        "{expired:?}"
    );
    drop(next);
}

#[tokio::test]
async fn health_readiness_and_the_page_are_served() {
    let (_server, http) = server_with_http(&[]).await;
    assert_eq!(get(http, "/healthz").await, (200, "ok\n".into()));
    assert_eq!(get(http, "/readyz").await, (200, "ready\n".into()));
    let (code, page) = get(http, "/").await;
    assert_eq!(code, 200);
    assert!(page.contains("<script src=\"page.js\">"), "{page}");
    let (code, script) = get(http, "/page.js").await;
    assert_eq!(code, 200);
    assert!(script.contains("api/locks"));
    let (code, body) = get(http, "/api/locks?prefix=nothing-here/").await;
    assert_eq!(code, 200);
    let json: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(json["locks"], serde_json::json!([]));
    // A server on its own is a cluster of one: itself, the leader.
    let (code, body) = get(http, "/api/cluster").await;
    assert_eq!(code, 200, "{body}");
    let cluster: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(cluster["node_id"], 1);
    assert_eq!(cluster["leader_id"], 1);
    assert_eq!(cluster["members"][0]["role"], "leader", "{cluster}");
    assert_eq!(cluster["members"].as_array().map(Vec::len), Some(1));
    // Where entries spent their time, by stage (the member's own first
    // entries, its membership and a new leader's grace, went through each).
    let (code, stats) = get(http, "/debug/raft").await;
    assert_eq!(code, 200, "{stats}");
    for stage in ["submitted", "persisted", "committed", "applied"] {
        assert!(stats.contains(stage), "{stage}: {stats}");
    }
    assert_eq!(get(http, "/nowhere").await.0, 404);
}

/// `chromium --headless --dump-dom`: the page as the browser built it, after
/// its scripts had a few seconds (of virtual time) to fetch and render.
fn dump_dom(url: &str) -> String {
    let profile = tempfile::tempdir().expect("profile directory");
    let output = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=3000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(url)
        .stderr(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run chromium ({e}): install it with `apt-get install chromium`")
        });
    assert!(output.status.success(), "chromium failed: {output:?}");
    String::from_utf8(output.stdout).expect("UTF-8 DOM")
}

/// The rows of the table with this id in a dumped DOM.
fn table_body<'a>(dom: &'a str, id: &str) -> &'a str {
    let start = dom
        .find(&format!("<table id=\"{id}\">"))
        .unwrap_or_else(|| panic!("no table {id} in\n{dom}"));
    let table = &dom[start..];
    &table[..table.find("</table>").expect("table end")]
}

#[tokio::test]
async fn the_page_shows_a_held_lock_in_a_browser_and_drops_it_after_release() {
    let (server, http) = server_with_http(&[]).await;
    let name = unique("page");
    let mut hold = Command::new(BINARY)
        .args(["hold", &name, "--owner", "page-test-owner", "--backend"])
        .arg(server.url())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("locksmith hold");
    let mut token = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(hold.stdout.take().expect("stdout")),
        &mut token,
    )
    .expect("the fencing token");
    let token = token.trim().to_owned();
    assert!(token.parse::<u64>().is_ok(), "{token:?}");

    let page = format!(
        "http://127.0.0.1:{http}/?prefix={}#lock={}",
        name.replace('/', "%2F"),
        name.replace('/', "%2F")
    );
    let dom = dump_dom(&page);
    let locks = table_body(&dom, "locks");
    assert!(locks.contains(&name), "{locks}");
    assert!(locks.contains("page-test-owner"), "{locks}");
    assert!(locks.contains("locksmith hold["), "{locks}");
    assert!(
        locks.contains(&format!("<td class=\"token num\">{token}</td>")),
        "{locks}"
    );
    let grants = table_body(&dom, "grants");
    assert!(grants.contains(&format!("<td class=\"token num\">{token}</td>")));
    assert!(grants.contains("<td>held</td>"), "{grants}");
    let cluster = table_body(&dom, "cluster");
    assert!(cluster.contains("1 (this page)"), "{cluster}");
    assert!(
        cluster.contains("<td class=\"leader\">leader</td>"),
        "{cluster}"
    );

    // SIGINT: `hold` releases and exits.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(hold.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .expect("signal hold");
    assert!(hold.wait().expect("hold exits").success());
    let dom = dump_dom(&page);
    let locks = table_body(&dom, "locks");
    assert!(!locks.contains(&name), "{locks}");
    assert!(
        dom.contains("<p id=\"no-locks\" class=\"empty\">No lock is held"),
        "{dom}"
    );
    // The history remembers the grant and says it was released.
    let grants = table_body(&dom, "grants");
    assert!(grants.contains(&format!("<td class=\"token num\">{token}</td>")));
    assert!(grants.contains("released "), "{grants}");
}

#[tokio::test]
async fn status_json_has_the_documented_fields() {
    let server = ServerProcess::start();
    let name = unique("status-json");
    let client = server.client(Duration::from_secs(10)).await;
    let guard = client
        .lock(name.as_str())
        .owner("json-owner")
        .acquire()
        .await
        .expect("acquire");
    let output = Command::new(BINARY)
        .args(["status", &name, "--json", "--history", "--backend"])
        .arg(server.url())
        .output()
        .expect("locksmith status");
    assert!(output.status.success(), "{output:?}");
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).expect("valid JSON");
    assert_eq!(json["backend"], "server");
    assert_eq!(json["prefix"], name.as_str());
    assert!(json["at"].as_str().is_some_and(|at| at.ends_with('Z')));
    let lock = &json["locks"][0];
    assert_eq!(lock["name"], name.as_str());
    assert_eq!(lock["waiters"], serde_json::json!([]));
    let holder = &lock["holders"][0];
    assert_eq!(holder["owner"], "json-owner");
    assert_eq!(holder["mode"], "exclusive");
    assert_eq!(holder["hold_count"], 1);
    assert_eq!(holder["fencing_token"], guard.fencing_token());
    assert!(holder["lock_by"]
        .as_str()
        .is_some_and(|by| by.contains('@')));
    for field in ["lock_time", "lease_expires"] {
        assert!(holder[field].is_string(), "{field}: {holder}");
    }
    assert!(holder["lease_left_ms"]
        .as_u64()
        .is_some_and(|ms| ms <= 10_000));
    let grant = &json["history"][0];
    assert_eq!(grant["fencing_token"], guard.fencing_token());
    assert_eq!(grant["end"], "held");
    assert_eq!(grant["ended_at"], serde_json::Value::Null);
    for field in ["name", "owner", "lock_by", "mode", "granted_at"] {
        assert!(grant[field].is_string(), "{field}: {grant}");
    }
    assert!(grant["waited_ms"].is_u64());
}

#[test]
fn serve_reads_a_config_file_and_flags_win() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let (grpc_in_file, grpc, http) = (free_port(), free_port(), free_port());
    let config = dir.path().join("locksmith.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{grpc_in_file}\"\n\
             metrics-listen = \"127.0.0.1:{http}\"\n\
             in-memory = true\n\
             grace = \"3s\"\n\
             history-per-lock = 4\n\
             worker-threads = 3\n"
        ),
    )
    .expect("write config");
    let mut serve = Command::new(BINARY)
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .args(["--listen", &format!("127.0.0.1:{grpc}")])
        .stderr(Stdio::piped())
        .spawn()
        .expect("locksmith serve");
    let mut log = std::io::BufReader::new(serve.stderr.take().expect("stderr"));
    let mut seen = String::new();
    while !seen.contains("locksmith server listening") {
        let mut line = String::new();
        let read = std::io::BufRead::read_line(&mut log, &mut line).expect("read log");
        assert!(read > 0, "serve exited early:\n{seen}");
        seen.push_str(&line);
    }
    serve.kill().expect("stop serve");
    let _ = serve.wait();
    assert!(seen.contains("in-memory mode"), "{seen}");
    assert!(seen.contains("worker_threads=3"), "{seen}");
    // The workspace's build turns the workers' LIFO slot off (`locksmith_server::runtime`).
    assert!(seen.contains("lifo_slot=\"off\""), "{seen}");
    assert!(seen.contains(&format!("127.0.0.1:{http}")), "{seen}");
    assert!(seen.contains(&format!("127.0.0.1:{grpc}")), "{seen}");
    assert!(
        !seen.contains(&format!("127.0.0.1:{grpc_in_file}")),
        "{seen}"
    );

    let output = Command::new(BINARY)
        .args(["serve", "--in-memory", "--worker-threads", "0"])
        .output()
        .expect("locksmith serve");
    assert_eq!(output.status.code(), Some(2));
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(error.contains("--worker-threads"), "{error}");

    std::fs::write(&config, "listen = \"127.0.0.1:1\"\nno-such-setting = 1\n").expect("write");
    let output = Command::new(BINARY)
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .output()
        .expect("locksmith serve");
    assert_eq!(output.status.code(), Some(2));
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(
        error.contains("unknown setting `no-such-setting`"),
        "{error}"
    );
}

#[test]
fn the_example_config_in_docs_is_accepted() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/locksmith.toml");
    // `--help` after the expansion: clap parses and checks every setting of
    // the file first, then prints the help and exits 0.
    let output = Command::new(BINARY)
        .arg("serve")
        .arg("--config")
        .arg(&example)
        .arg("--help")
        .output()
        .expect("locksmith serve");
    assert!(output.status.success(), "{output:?}");
}

#[test]
fn completions_and_man_page_come_from_the_command_definitions() {
    let run = |args: &[&str]| {
        let output = Command::new(BINARY).args(args).output().expect("locksmith");
        assert!(output.status.success(), "{args:?}: {output:?}");
        String::from_utf8(output.stdout).expect("UTF-8")
    };
    let bash = run(&["completions", "bash"]);
    assert!(bash.contains("_locksmith()") && bash.contains("--metrics-listen"));
    assert!(run(&["completions", "zsh"]).contains("#compdef locksmith"));
    let man = run(&["man"]);
    assert!(man.contains(".TH locksmith 1"), "{man}");
    let dir = tempfile::tempdir().expect("temporary directory");
    run(&["man", "--dir", dir.path().to_str().expect("UTF-8 path")]);
    let serve = std::fs::read_to_string(dir.path().join("locksmith-serve.1")).expect("serve page");
    assert!(serve.contains("metrics\\-listen"), "{serve}");
}

/// `locksmith run` prints the command's output and nothing else on every
/// backend: no log line of the client libraries underneath (ZooKeeper's
/// session states, a Redis reconnect as the process exits), no warning
/// after a normal exit. `-vv` shows those logs.
#[test]
fn run_prints_only_the_commands_output_on_every_backend() {
    let server = ServerProcess::start();
    let redis = locksmith_testkit::Redis::start();
    let zookeeper = locksmith_testkit::ZooKeeper::start();
    let etcd = locksmith_testkit::Etcd::start();
    let postgres = locksmith_testkit::Postgres::start();
    let backends = [
        server.url(),
        redis.url(),
        zookeeper.url(),
        etcd.url(),
        postgres.url(),
        "memory://".to_owned(),
    ];
    let run = |backend: &str, verbose: &[&str]| {
        let name = unique("quiet");
        let output = Command::new(BINARY)
            .args(["run", &name, "--backend", backend])
            .args(verbose)
            .args(["--", "echo", "ran"])
            .env_remove("RUST_LOG")
            .env_remove("LOCKSMITH_BACKEND")
            .stdin(Stdio::null())
            .output()
            .expect("locksmith run");
        let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
        (output.status, text(&output.stdout), text(&output.stderr))
    };
    for backend in &backends {
        let (status, stdout, stderr) = run(backend, &[]);
        assert!(status.success(), "{backend}: {status}: {stderr}");
        assert_eq!(stdout, "ran\n", "{backend}");
        assert_eq!(stderr, "", "{backend}: nothing but the command's output");
    }
    let (status, stdout, stderr) = run(&zookeeper.url(), &["-vv"]);
    assert!(status.success(), "{status}: {stderr}");
    assert_eq!(stdout, "ran\n");
    assert!(!stderr.is_empty(), "-vv shows the libraries' logs");
}
