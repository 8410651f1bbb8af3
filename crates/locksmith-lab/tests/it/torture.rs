//! The short CI torture: every backend, against a real server started by the
//! run, with the faults that matter most, in a few seconds each.
//!
//! - `pause-client`: SIGSTOP a holder past its session (a GC pause), so the
//!   fenced resource must refuse its stale write;
//! - `restart-backend`: kill -9 and restart the server while a holder stays
//!   inside: tokens must not go back, and nobody else may get the lock unless
//!   the holder is told it lost it;
//! - `partition`: cut the holder off the backend for twice its session TTL;
//! - `kill-client` (server only): kill -9 a holder and respawn it;
//! - `expire-session` (PostgreSQL only): `pg_terminate_backend` on the holder;
//! - on the replicated setups, `kill-primary`, `pause-primary` and (but on
//!   ZooKeeper) `partition-leader` (the Redis primary behind Sentinel, the
//!   primary of the holder's slot on a Redis Cluster, the etcd, ZooKeeper and
//!   locksmith leader; for `partition-leader` cut off from its peers, every
//!   member in a network namespace of its own) and, on Redlock, `restart-empty-late` (a
//!   master restarted without its data only after a session TTL, the
//!   mitigation that keeps Redlock safe) and `partition-minority` (two
//!   masters of five silent, their traffic delivered late when it heals);
//! - on the locksmith cluster, also `restart-follower` and
//!   `membership-change` (a new member promoted, the leader removed).
//!
//! Each test runs `locksmith-lab torture --quick …` and fails on a non-zero exit:
//! any safety violation, any liveness failure, or a round that could not run.
//! The output (the summary table and the findings) is in the failure message.
//!
//! The locksmith server is the `locksmith` executable beside `locksmith-lab`
//! in the target directory: cargo builds it when the run includes
//! locksmith-cli (`cargo nextest run --workspace`, or `-p locksmith-cli -p
//! locksmith-lab`).

use std::process::Command;

/// Runs a short torture of `backend` with `faults` and fails on any finding.
fn torture(backend: &str, faults: &str) {
    let out = tempfile::tempdir().expect("temporary directory");
    let output = Command::new(env!("CARGO_BIN_EXE_locksmith-lab"))
        .args(["torture", "--quick", "--spawn", backend, "--fault", faults])
        .args(["--clients", "4", "--session-ttl", "2s"])
        .args(["--before", "500ms", "--during", "2s", "--after", "1s"])
        .arg("--out")
        .arg(out.path())
        .env("RUST_LOG", "warn")
        .output()
        .expect("run locksmith-lab torture");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        let logs: String = std::fs::read_dir(out.path())
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.starts_with("clients-") || name.starts_with("servers-")
            })
            .map(|e| {
                let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                format!(
                    "--- {} (last lines)\n{}\n",
                    e.file_name().to_string_lossy(),
                    lines[lines.len().saturating_sub(15)..].join("\n")
                )
            })
            .collect();
        panic!(
            "locksmith-lab torture --spawn {backend} --fault {faults} failed ({}):\n{stdout}\n{stderr}\n{logs}",
            output.status
        );
    }
    // Every requested fault ran and was judged.
    for fault in faults.split(',') {
        let row = format!("| {backend} | {fault} |");
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(&row) && l.ends_with("| ok |")),
            "no passing row for {backend} × {fault}:\n{stdout}"
        );
    }
    // The logs of the servers it started are kept beside the clients'.
    let first_server_log = out.path().join(format!("servers-{backend}-1.log"));
    assert!(
        first_server_log.exists(),
        "no {} in {:?}",
        first_server_log.display(),
        std::fs::read_dir(out.path())
            .map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
    );
    let json = std::fs::read_to_string(out.path().join("torture.json")).expect("torture.json");
    let rounds: serde_json::Value = serde_json::from_str(&json).expect("torture.json is JSON");
    for round in rounds.as_array().expect("a list of rounds") {
        assert!(
            round["verdict"]["grants"].as_u64().unwrap_or(0) > 0,
            "a round without grants: {round}"
        );
        // The baseline round injects nothing; there a lost hold is itself a
        // finding (a healthy holder must keep its lock).
        if round["fault"] != "none" {
            assert!(
                !round["injected"].as_array().expect("injected").is_empty(),
                "a round without an injected fault: {round}"
            );
        }
    }
}

#[test]
fn server() {
    torture(
        "server",
        "none,kill-client,pause-client,restart-backend,partition",
    );
}

#[test]
fn redis() {
    torture("redis", "pause-client,restart-backend,partition");
}

#[test]
fn zookeeper() {
    torture("zookeeper", "pause-client,restart-backend,partition");
}

#[test]
fn etcd() {
    torture("etcd", "pause-client,restart-backend,partition");
}

#[test]
fn postgres() {
    torture("postgres", "pause-client,restart-backend,expire-session");
}

#[test]
fn redis_sentinel() {
    torture(
        "redis-sentinel",
        "kill-primary,pause-primary,partition-leader",
    );
}

#[test]
fn redis_cluster() {
    torture(
        "redis-cluster",
        "kill-primary,pause-primary,partition-leader",
    );
}

#[test]
fn redlock() {
    torture("redlock", "restart-empty-late,partition-minority");
}

#[test]
fn etcd_cluster() {
    torture(
        "etcd-cluster",
        "kill-primary,pause-primary,partition-leader",
    );
}

#[test]
fn zookeeper_ensemble() {
    torture(
        "zookeeper-ensemble",
        "kill-primary,pause-primary,partition-leader",
    );
}

#[test]
fn server_cluster() {
    torture(
        "server-cluster",
        "none,kill-client,kill-primary,pause-primary,restart-follower,expire-session,\
         partition-leader,membership-change",
    );
}

/// The cluster once more with TLS (members certified by a CA of their own)
/// and authentication on, through a leader's death, its partition (members
/// on hosts of their own, clients through loopback proxies) and a
/// membership change.
#[test]
fn server_cluster_tls() {
    torture(
        "server-cluster-tls",
        "none,kill-primary,partition-leader,membership-change",
    );
}
