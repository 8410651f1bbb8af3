//! `locksmith-lab bench` end to end, small: the locksmith server (started by the
//! bench as `locksmith serve`) and `memory://`, every scenario, every output;
//! and the scale scenario on PostgreSQL past its default lock table.
//!
//! The server is the `locksmith` executable beside `locksmith-lab` in the
//! target directory: cargo builds it when the run includes locksmith-cli
//! (`cargo nextest run --workspace`, or `-p locksmith-cli -p locksmith-lab`).

use std::path::Path;
use std::process::Command;

/// Runs `locksmith-lab bench ARGS --out OUT`, expects success and returns its
/// standard output (the Markdown report).
fn bench(args: &[&str], out: &Path) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_locksmith-lab"))
        .arg("bench")
        .args(args)
        .arg("--out")
        .arg(out)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run locksmith-lab bench");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "locksmith-lab bench failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[test]
fn bench_writes_the_report_json_and_charts() {
    let out = tempfile::tempdir().expect("temporary directory");
    let stdout = bench(
        &[
            "--quick",
            "--spawn",
            "server,memory",
            "--duration",
            "300ms",
            "--clients",
            "1,4",
            "--waiters",
            "3",
            "--fair-clients",
            "4",
            "--scale",
            "300",
            "--scale-server",
            "1000",
            "--client-slice",
            "200us",
        ],
        out.path(),
    );

    // The Markdown: one row per backend in each table, ratios against the server.
    for heading in [
        "(a) Uncontended",
        "(b) Contended handoff",
        "CPU per operation",
        "(c) Fairness",
        "(d) Scale",
    ] {
        assert!(stdout.contains(heading), "no {heading} table:\n{stdout}");
    }
    assert!(stdout.contains("| server | "), "{stdout}");
    assert!(stdout.contains("| memory | "), "{stdout}");
    assert!(
        stdout.contains("(1.00×)"),
        "no ratios against the server:\n{stdout}"
    );
    assert!(!stdout.contains("failed:"), "a scenario failed:\n{stdout}");
    let markdown = std::fs::read_to_string(out.path().join("report.md")).expect("report.md");
    assert!(markdown.contains("![") && markdown.contains("throughput.svg"));

    // The JSON: every figure present for both backends.
    let json = std::fs::read_to_string(out.path().join("report.json")).expect("report.json");
    let report: serde_json::Value = serde_json::from_str(&json).expect("report.json is JSON");
    assert_eq!(report["reference"], "server");
    // The clients' runtime is part of the settings: it moves every figure.
    let workers = report["settings"]["client_workers"].as_u64().unwrap_or(0);
    assert!(workers >= 1, "no client workers in {}", report["settings"]);
    assert!(
        markdown.contains(&format!("the clients on a runtime of {workers} worker")),
        "{markdown}"
    );
    // So is the scheduler slice its threads asked for.
    assert_eq!(report["settings"]["client_slice_us"], 200);
    assert!(
        markdown.contains("its threads on a scheduler slice of 200 µs"),
        "{markdown}"
    );
    assert!(report["machine"]["nproc"].as_u64().unwrap() >= 1);
    let backends = report["backends"].as_array().expect("backends");
    assert_eq!(backends.len(), 2);
    for backend in backends {
        let label = backend["label"].as_str().unwrap();
        let uncontended = backend["uncontended"].as_array().unwrap();
        assert_eq!(uncontended.len(), 2, "{label}");
        for point in uncontended {
            assert!(
                point["pairs_per_sec"].as_f64().unwrap() > 0.0,
                "{label}: {point}"
            );
        }
        let handoff = &backend["handoff"];
        assert!(
            handoff["grants_per_sec"].as_f64().unwrap() > 0.0,
            "{label}: {handoff}"
        );
        assert!(
            handoff["handoff"]["count"].as_u64().unwrap() > 0,
            "{label}: {handoff}"
        );
        let fairness = &backend["fairness"];
        let jain = fairness["jain"].as_f64().unwrap();
        assert!((0.0..=1.0 + 1e-9).contains(&jain), "{label}: {fairness}");
        let scale = &backend["scale"];
        let expected = if label == "server" { 1000 } else { 300 };
        assert_eq!(
            scale["locks"].as_u64().unwrap(),
            expected,
            "{label}: {scale}"
        );
    }
    // The server was started by the run, so its memory is known.
    let server = backends.iter().find(|b| b["label"] == "server").unwrap();
    assert!(
        server["scale"]["memory_held"].as_u64().unwrap() > 0,
        "{server}"
    );
    assert!(server["version"].as_str().unwrap().starts_with("locksmith"));
    // CPU per operation: the bench's own, and the store's where this run
    // started it (`memory://` runs in the bench's process: no store figure).
    for backend in backends {
        let label = backend["label"].as_str().unwrap();
        let cpus = backend["uncontended"]
            .as_array()
            .unwrap()
            .iter()
            .chain([&backend["handoff"]])
            .map(|measured| &measured["cpu"]);
        for cpu in cpus {
            assert!(
                cpu["bench_run_us"].as_f64().unwrap() > 0.0,
                "{label}: {cpu}"
            );
            assert!(
                cpu["bench_wait_us"].as_f64().unwrap() >= 0.0,
                "{label}: {cpu}"
            );
            match label {
                "server" => assert!(cpu["store_run_us"].as_f64().unwrap() > 0.0, "{cpu}"),
                _ => assert!(cpu["store_run_us"].is_null(), "{label}: {cpu}"),
            }
        }
    }

    // The charts are SVG documents.
    for chart in ["throughput.svg", "handoff-latency.svg", "fairness-wait.svg"] {
        let svg = std::fs::read_to_string(out.path().join(chart)).expect(chart);
        assert!(svg.starts_with("<svg") && svg.contains("</svg>"), "{chart}");
        assert!(
            svg.contains("server") && svg.contains("memory"),
            "{chart} lacks a legend"
        );
    }
}

/// The backup scenario, small (3 000 locks, 200 ms windows), against a
/// `spawn` this run starts with `saves` saves: what the report says of it,
/// once the run printed the scenario and no failure.
fn small_backup(spawn: &str, saves: u32) -> serde_json::Value {
    let out = tempfile::tempdir().expect("temporary directory");
    let saves = saves.to_string();
    let stdout = bench(
        &[
            "--spawn",
            spawn,
            "--scenarios",
            "backup",
            "--scale-server",
            "3000",
            "--saves",
            &saves,
            "--duration",
            "200ms",
            "--waiters",
            "3",
        ],
        out.path(),
    );
    assert!(stdout.contains("(f) Backup and restore"), "{stdout}");
    assert!(
        !stdout.contains("failed:"),
        "the scenario failed:\n{stdout}"
    );
    let json = std::fs::read_to_string(out.path().join("report.json")).expect("report.json");
    let mut report: serde_json::Value = serde_json::from_str(&json).expect("report.json is JSON");
    report["backends"][0]["backup"].take()
}

/// The backup scenario on a group of one: the server holds the locks,
/// `locksmith snapshot save` backs them up beside the handoff loop, and a
/// server restored from the backup grants.
#[test]
fn bench_backup_saves_the_held_locks_and_a_restored_server_grants() {
    let backup = small_backup("server", 2);
    assert_eq!(backup["locks"], 3000, "{backup}");
    // The held locks, and the handoff loop's lock if it was held then.
    let saved = backup["backup_locks"].as_u64().unwrap();
    assert!((3000..=3001).contains(&saved), "{backup}");
    assert_eq!(
        backup["saves_secs"].as_array().unwrap().len(),
        2,
        "{backup}"
    );
    assert!(
        backup["file_bytes"].as_u64().unwrap() > 3000 * 16,
        "{backup}"
    );
    assert!(
        backup["handoff_alone"]["count"].as_u64().unwrap() > 0,
        "{backup}"
    );
    assert_eq!(backup["members"], 1, "{backup}");
    // A group of one has no follower: both saves came from its leader.
    let leader = backup["leader_id"].as_u64().unwrap();
    assert_eq!(
        backup["saved_from"],
        serde_json::json!([[leader, true], [leader, true]]),
        "{backup}"
    );
    let cpu = backup["member_cpu"].as_array().unwrap();
    assert_eq!(cpu.len(), 1, "{backup}");
    assert_eq!(cpu[0]["id"].as_u64(), Some(leader), "{backup}");
    assert!(backup["serve_secs"].as_f64().unwrap() > 0.0, "{backup}");
    // Nobody joins a group of one.
    assert!(backup["join"].is_null(), "{backup}");
}

/// The backup scenario on a cluster: the save comes from a follower, a new
/// member joins and catches up, and a restored cluster of three grants.
#[test]
fn bench_backup_on_a_cluster_saves_from_a_follower_and_a_member_joins() {
    let backup = small_backup("server-cluster", 1);
    assert_eq!(backup["members"], 3, "{backup}");
    let leader = backup["leader_id"].as_u64().unwrap();
    let from = &backup["saved_from"][0];
    assert_eq!(from[1], false, "a caught-up follower's: {backup}");
    assert_ne!(from[0].as_u64(), Some(leader), "{backup}");
    // The member that joined caught up (the scenario fails otherwise).
    assert!(backup["join"]["secs"].as_f64().unwrap() > 0.0, "{backup}");
    assert!(backup["serve_secs"].as_f64().unwrap() > 0.0, "{backup}");
}

#[test]
fn bench_refuses_nonsense() {
    let output = Command::new(env!("CARGO_BIN_EXE_locksmith-lab"))
        .args(["bench", "--spawn", "mysql"])
        .output()
        .expect("run locksmith-lab bench");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("unknown backend \"mysql\""), "{stderr}");

    let output = Command::new(env!("CARGO_BIN_EXE_locksmith-lab"))
        .args(["bench", "--backend", "ftp://example.com"])
        .output()
        .expect("run locksmith-lab bench");
    assert!(!output.status.success());

    // A slice the kernel would clamp, or take as "the default", is refused.
    let output = Command::new(env!("CARGO_BIN_EXE_locksmith-lab"))
        .args(["bench", "--spawn", "memory", "--client-slice", "0s"])
        .output()
        .expect("run locksmith-lab bench");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("outside the slices the kernel grants"),
        "{stderr}"
    );
}

/// `--spawn server` needs the `locksmith` executable: without one beside
/// `locksmith-lab` or on PATH, the bench stops before starting anything and
/// says how to build it; one named with `--locksmith` must exist.
#[test]
fn bench_without_locksmith_says_how_to_build_it() {
    let lab = Path::new(env!("CARGO_BIN_EXE_locksmith-lab"));
    // A copy with no `locksmith` beside it, in the target directory (a hard
    // link when the file system allows).
    let alone = tempfile::tempdir_in(lab.parent().unwrap()).expect("temporary directory");
    let copy = alone.path().join("locksmith-lab");
    std::fs::hard_link(lab, &copy)
        .or_else(|_| std::fs::copy(lab, &copy).map(drop))
        .expect("copy locksmith-lab");
    let output = Command::new(&copy)
        .args(["bench", "--spawn", "server,memory"])
        .env("PATH", alone.path())
        .env_remove("LOCKSMITH_BIN")
        .output()
        .expect("run locksmith-lab bench");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("cannot find the `locksmith` executable")
            && stderr.contains("cargo build --release -p locksmith-cli"),
        "{stderr}"
    );
    assert!(output.stdout.is_empty(), "it measured something");

    let output = Command::new(lab)
        .args([
            "bench",
            "--spawn",
            "server",
            "--locksmith",
            "/nonexistent/locksmith",
        ])
        .output()
        .expect("run locksmith-lab bench");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--locksmith /nonexistent/locksmith: no such file"),
        "{stderr}"
    );
}

/// PostgreSQL's default lock table (64 × max_connections slots, some 23 000
/// advisory locks here) cannot hold the scale scenario's 30 000 locks; the
/// bench makes room, and says so.
#[test]
fn bench_scale_holds_more_locks_than_postgres_holds_by_default() {
    let out = tempfile::tempdir().expect("temporary directory");
    let stdout = bench(
        &[
            "--spawn",
            "postgres",
            "--scenarios",
            "scale",
            "--scale",
            "30000",
        ],
        out.path(),
    );
    assert!(
        stdout.contains("`max_locks_per_transaction=256`"),
        "the report does not say what the bench changed:\n{stdout}"
    );
    let json = std::fs::read_to_string(out.path().join("report.json")).expect("report.json");
    let report: serde_json::Value = serde_json::from_str(&json).expect("report.json is JSON");
    let scale = &report["backends"][0]["scale"];
    assert_eq!(scale["locks"], 30000, "{scale}");
    assert_eq!(scale["lost_at_peak"], 0, "{scale}");
    assert!(scale["bytes_per_lock"].as_f64().unwrap() > 0.0, "{scale}");
}

/// The sessions scenario, small, with each renewal sent at its own instant
/// (`--spread-renewals`): the server's idle sessions, on channels of a
/// `Sessions` stream per connection, are kept alive and their renewals
/// timed, and the report says how they were sent.
#[test]
fn bench_sessions_keeps_idle_sessions_with_their_renewals_spread() {
    let out = tempfile::tempdir().expect("temporary directory");
    let stdout = bench(
        &[
            "--spawn",
            "server",
            "--scenarios",
            "sessions",
            "--idle-sessions",
            "200",
            "--sessions-per-connection",
            "50",
            "--session-ttl",
            "3s",
            "--duration",
            "300ms",
            "--waiters",
            "3",
            "--spread-renewals",
        ],
        out.path(),
    );
    assert!(
        !stdout.contains("failed:"),
        "the scenario failed:\n{stdout}"
    );
    assert!(stdout.contains("renewals spread"), "{stdout}");
    let json = std::fs::read_to_string(out.path().join("report.json")).expect("report.json");
    let report: serde_json::Value = serde_json::from_str(&json).expect("report.json is JSON");
    let sessions = &report["backends"][0]["sessions"];
    assert_eq!(sessions["sessions"], 200, "{sessions}");
    assert_eq!(sessions["renewals_spread"], true, "{sessions}");
    assert_eq!(
        sessions["session_kind"], "channel of a Sessions stream",
        "{sessions}"
    );
    assert!(
        sessions["heartbeat"]["count"].as_u64().unwrap() > 0,
        "no renewal timed: {sessions}"
    );
}
