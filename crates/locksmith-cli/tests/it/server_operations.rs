//! Operating a cluster as an operator does: `locksmith snapshot save` from a
//! cluster under load, `snapshot restore` into the data directories of a new
//! cluster, a new cluster from one surviving member's data after the quorum
//! is lost, and a rolling upgrade, where a newer log record kind stays
//! unused until every member reads it.

use crate::server_support;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use locksmith::{Client, ConnectOptions};
use locksmith_core::Snapshot;
use locksmith_proto::v1 as pb;
use locksmith_proto::v1::locksmith_client::LocksmithClient;
use locksmith_server::backup::{Backup, TOKEN_JUMP};
use locksmith_testkit::free_port;
use server_support::{
    cluster_flag, cluster_status, leader, members_url, record_versions, unique, url_of,
    ServerProcess, BINARY,
};

/// Runs `locksmith ARGS`, returning (success, stdout + stderr).
async fn locksmith(args: Vec<String>) -> (bool, String) {
    tokio::task::spawn_blocking(move || run(std::process::Command::new(BINARY).args(&args)))
        .await
        .unwrap()
}

/// Runs `command` to its end, returning (success, stdout + stderr).
fn run(command: &mut std::process::Command) -> (bool, String) {
    let output = command.output().expect("run locksmith");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// A group of one for the tests that leave its state as they found it.
fn server() -> &'static ServerProcess {
    static SERVER: std::sync::OnceLock<ServerProcess> = std::sync::OnceLock::new();
    let server = SERVER.get_or_init(ServerProcess::start);
    server.assert_running();
    server
}

/// `locksmith snapshot save FILE FLAG URL [MORE]` (`FLAG`: `--backend`, or
/// its older spelling `--server`) from the cluster at `url`.
async fn save(flag: &str, url: &str, file: &Path, more: &[&str]) -> Backup {
    save_saying(flag, url, file, more).await.0
}

/// As [`save`], with what the command printed.
async fn save_saying(flag: &str, url: &str, file: &Path, more: &[&str]) -> (Backup, String) {
    let mut args = vec![
        "snapshot".into(),
        "save".into(),
        file.display().to_string(),
        flag.into(),
        url.into(),
    ];
    args.extend(more.iter().map(|arg| arg.to_string()));
    let (ok, text) = locksmith(args).await;
    assert!(ok, "snapshot save failed: {text}");
    let backup =
        Backup::read(file).unwrap_or_else(|e| panic!("the saved backup does not read: {e}"));
    (backup, text)
}

/// Starts the members of a new cluster on `ports`, each data directory made
/// by `locksmith snapshot restore` with `source` (a backup file, or
/// `--from-member-data DIR --force-new-cluster`).
async fn restored_cluster(source: &[String], ports: &[u16]) -> Vec<ServerProcess> {
    let mut members = Vec::new();
    for (i, &port) in ports.iter().enumerate() {
        let mut args: Vec<String> = vec!["snapshot".into(), "restore".into()];
        args.extend_from_slice(source);
        args.extend([
            "--node-id".into(),
            (i + 1).to_string(),
            "--cluster".into(),
            cluster_flag(ports),
        ]);
        let restore = |dir: &Path| {
            let mut args = args.clone();
            args.extend(["--data-dir".into(), dir.display().to_string()]);
            let output = std::process::Command::new(BINARY)
                .args(&args)
                .output()
                .expect("run locksmith snapshot restore");
            assert!(
                output.status.success(),
                "restore failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        };
        let id = (i + 1).to_string();
        let list = cluster_flag(ports);
        members.push(ServerProcess::start_prepared_on(
            port,
            restore,
            &["--node-id", &id, "--cluster", &list],
        ));
    }
    members
}

/// What of the engine's state a restore keeps as it was: every lock's
/// holders (session, owner, mode, token, count) and queue, the waiters and
/// the sessions. Times are left out: a new leader extends every deadline
/// first, as after any election.
fn kept(engine: &Snapshot) -> impl PartialEq + std::fmt::Debug {
    let locks: Vec<_> = engine
        .locks
        .iter()
        .map(|lock| {
            let holders: Vec<_> = lock
                .holders
                .iter()
                .map(|h| (h.session, h.owner.clone(), h.mode, h.token, h.count))
                .collect();
            (lock.name.clone(), holders, lock.queue.clone())
        })
        .collect();
    let waiters: Vec<_> = engine
        .waiters
        .iter()
        .map(|w| (w.session, w.request, w.names.clone(), w.owner.clone()))
        .collect();
    let sessions: Vec<_> = engine.sessions.iter().map(|s| s.session).collect();
    (locks, waiters, sessions)
}

/// Clients that acquire and release locks of `prefix` until `stop`, each
/// also holding a few for good; the highest token any was granted goes into
/// `highest`.
fn start_load(
    url: &str,
    prefix: &str,
    stop: Arc<AtomicBool>,
    highest: Arc<AtomicU64>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..3)
        .map(|worker| {
            let (url, prefix) = (url.to_owned(), prefix.to_owned());
            let (stop, highest) = (stop.clone(), highest.clone());
            tokio::spawn(async move {
                let options = ConnectOptions::default().session_ttl(Duration::from_secs(30));
                let client = Client::connect_with(&url, options).await.expect("connect");
                let mut kept = Vec::new();
                for n in 0..5 {
                    let guard = client
                        .lock(format!("{prefix}/held/{worker}/{n}"))
                        .acquire()
                        .await
                        .expect("acquire");
                    highest.fetch_max(guard.fencing_token(), Ordering::SeqCst);
                    kept.push(guard);
                }
                let mut n = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    n += 1;
                    let lock = client.lock(format!("{prefix}/busy/{}", n % 8));
                    let guard = lock.acquire().await.expect("acquire");
                    highest.fetch_max(guard.fencing_token(), Ordering::SeqCst);
                    guard.release().await.expect("release");
                }
                // The held locks stay held: the test ends with the client.
                std::mem::forget(kept);
                std::mem::forget(client);
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_saved_under_load_restores_the_state_and_tokens_start_above_every_one_granted() {
    let source = ServerProcess::start_cluster(&[]);
    let url = url_of(&source);
    let leading = leader(&source, &[]).await as u64 + 1;
    let prefix = unique("backup-under-load");
    let stop = Arc::new(AtomicBool::new(false));
    let highest = Arc::new(AtomicU64::new(0));
    let load = start_load(&url, &prefix, stop.clone(), highest.clone());
    // The load has started granting before the backup is taken.
    server_support::eventually(Duration::from_secs(20), "grants under load", || {
        let highest = highest.clone();
        async move { highest.load(Ordering::SeqCst) > 30 }
    })
    .await;

    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let file: PathBuf = dir.path().join("cluster.backup");
    // Every token seen so far was visible before the backup's state froze.
    let seen_before_save = highest.load(Ordering::SeqCst);
    let backup = save("--backend", &url, &file, &[]).await;
    let granted_before = highest.load(Ordering::SeqCst);
    assert_ne!(
        backup.summary().node_id,
        leading,
        "by default a backup is taken from a caught-up follower, not the leader"
    );
    let from_leader = save(
        "--backend",
        &url,
        &dir.path().join("leader.backup"),
        &["--leader"],
    )
    .await;
    assert_eq!(
        from_leader.summary().node_id,
        leading,
        "--leader takes it from the leader"
    );
    assert!(
        from_leader.summary().index >= backup.summary().index,
        "the leader's is as new as the follower's, or newer"
    );
    // Tokens go on being granted after the backup, which it cannot know.
    server_support::eventually(Duration::from_secs(20), "grants after the backup", || {
        let highest = highest.clone();
        async move { highest.load(Ordering::SeqCst) > granted_before + 20 }
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    for task in load {
        task.await.unwrap();
    }
    let granted = highest.load(Ordering::SeqCst);
    let summary = backup.summary();
    assert_eq!(
        summary.locks,
        backup
            .engine()
            .locks
            .iter()
            .filter(|l| !l.holders.is_empty())
            .count()
    );
    assert!(summary.locks >= 15, "the held locks are in it: {summary:?}");
    assert!(summary.last_token < granted, "tokens were granted after it");
    assert!(summary.token_ceiling >= summary.last_token, "{summary:?}");
    // The leader's ceiling covers every token it made visible; a follower's,
    // those it has applied (the rest are past its index, granted after it
    // as far as the backup knows, and the jump covers them).
    let leader_summary = from_leader.summary();
    assert!(
        leader_summary.token_ceiling >= seen_before_save.max(leader_summary.last_token),
        "the leader's token ceiling covers every token visible when it was taken: \
         {leader_summary:?}, {seen_before_save} seen before"
    );
    assert_eq!(
        summary.restore_floor,
        summary.token_ceiling + TOKEN_JUMP,
        "a restore starts above the ceiling, by the jump that covers tokens granted after it"
    );

    let (ok, text) = locksmith(vec![
        "snapshot".into(),
        "status".into(),
        file.display().to_string(),
    ])
    .await;
    assert!(ok, "{text}");
    let index = summary.index.unwrap().to_string();
    assert!(text.contains(&format!("log index:     {index}")), "{text}");
    assert!(
        text.contains(&format!("sessions:      {}", summary.sessions)),
        "{text}"
    );

    let new_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let restored = restored_cluster(&[file.display().to_string()], &new_ports).await;
    leader(&restored, &[]).await;
    let new_url = members_url(&new_ports);
    let again = save(
        "--server",
        &new_url,
        &dir.path().join("restored.backup"),
        &[],
    )
    .await;
    assert_eq!(
        kept(again.engine()),
        kept(backup.engine()),
        "the restored cluster holds the state the backup was taken at"
    );

    let client = Client::connect(&new_url).await.unwrap();
    let guard = client
        .lock(format!("{prefix}/after-restore"))
        .acquire()
        .await
        .unwrap();
    assert!(
        guard.fencing_token() > granted,
        "a token after the restore ({}) is above every token granted before it ({granted}), \
         including after the backup",
        guard.fencing_token()
    );
    assert!(guard.fencing_token() > summary.restore_floor);
    drop(source);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_that_does_not_answer_or_is_gone_is_passed_over_for_the_leader() {
    let members = ServerProcess::start_cluster(&[]);
    let url = url_of(&members);
    let leading = leader(&members, &[]).await;
    let followers = || {
        members
            .iter()
            .enumerate()
            .filter(move |(i, _)| *i != leading)
            .map(|(_, member)| member)
    };
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let from_the_leader = |backup: &Backup, text: &str| {
        assert!(
            text.contains("taking the backup from the leader instead"),
            "the operator is told: {text}"
        );
        assert!(text.contains("(the leader)"), "{text}");
        assert_eq!(backup.summary().node_id, leading as u64 + 1, "{text}");
    };

    // Stopped, the followers still accept connections (the kernel does) and
    // answer nothing; with nothing written since, the leader still counts
    // them caught up and names one.
    followers().for_each(ServerProcess::pause);
    let file = dir.path().join("silent.backup");
    let (backup, text) = save_saying("--backend", &url, &file, &["--follower-wait", "1s"]).await;
    assert!(text.contains("no part of the backup within 1s"), "{text}");
    from_the_leader(&backup, &text);

    // Dead, they refuse connections; the leader still names one.
    followers().for_each(ServerProcess::kill);
    let file = dir.path().join("gone.backup");
    let (backup, text) = save_saying("--backend", &url, &file, &[]).await;
    from_the_leader(&backup, &text);
}

/// `snapshot save` started in a session of its own (`setsid`) also lowers
/// that session's group (a nice value weighs only within the group the
/// kernel schedules a session's threads in); with `--full-priority`, or in
/// a session it does not lead (the shell's), it leaves the group alone.
#[cfg(target_os = "linux")]
#[test]
fn a_save_in_a_session_of_its_own_lowers_that_sessions_share() {
    use std::os::unix::process::CommandExt;
    if !Path::new("/proc/self/autogroup").exists() {
        eprintln!("this kernel groups no sessions (no /proc/self/autogroup): nothing to lower");
        return;
    }
    let server = server();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let save = |name: &str, own_session: bool, more: &[&str]| -> String {
        let mut command = std::process::Command::new(BINARY);
        command
            .args(["snapshot", "save"])
            .arg(dir.path().join(name))
            .args(["--backend", &server.url()])
            .args(more)
            .env("RUST_LOG", "locksmith_cli=debug");
        if own_session {
            // SAFETY: setsid is async-signal-safe; the child is not a
            // process group's leader, so it succeeds.
            unsafe {
                command.pre_exec(|| match libc::setsid() {
                    -1 => Err(std::io::Error::last_os_error()),
                    _ => Ok(()),
                });
            }
        }
        let (ok, text) = run(&mut command);
        assert!(ok, "snapshot save failed: {text}");
        text
    };
    let lowered = "this session's group lowered (autogroup) nice=10";
    let text = save("own-session.backup", true, &[]);
    assert!(text.contains(lowered), "{text}");
    let text = save("full-priority.backup", true, &["--full-priority"]);
    assert!(!text.contains("group lowered"), "{text}");
    let text = save("shared-session.backup", false, &[]);
    assert!(!text.contains("group lowered"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_cluster_from_one_surviving_member_keeps_its_locks_and_never_reuses_a_token() {
    let members = ServerProcess::start_cluster(&[]);
    let url = url_of(&members);
    let survivor = leader(&members, &[]).await;
    let name = unique("force-new-cluster");
    let options = ConnectOptions::default().session_ttl(Duration::from_secs(30));
    let client = Client::connect_with(&url, options).await.unwrap();
    let held = client.lock(&name).acquire().await.unwrap();
    let token = held.fencing_token();
    // The quorum is lost for good: every member dies; one's disk survives.
    for member in &members {
        member.kill();
    }
    std::mem::forget(held);
    let data = members[survivor].data_dir();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let new_data = dir.path().join("refused");
    let (ok, text) = locksmith(vec![
        "snapshot".into(),
        "restore".into(),
        "--from-member-data".into(),
        data.display().to_string(),
        "--data-dir".into(),
        new_data.display().to_string(),
    ])
    .await;
    assert!(!ok, "refused without --force-new-cluster: {text}");
    assert!(text.contains("--force-new-cluster"), "{text}");
    assert!(!new_data.exists(), "a refusal makes nothing");

    let port = free_port();
    let source = [
        "--from-member-data".to_string(),
        data.display().to_string(),
        "--force-new-cluster".into(),
    ];
    let restored = restored_cluster(&source, &[port]).await;
    leader(&restored, &[]).await;
    let mut inspect = LocksmithClient::connect(format!("http://127.0.0.1:{port}"))
        .await
        .unwrap();
    let lock = inspect
        .describe(pb::DescribeRequest { name: name.clone() })
        .await
        .unwrap()
        .into_inner();
    let holders: Vec<u64> = lock
        .lock
        .iter()
        .flat_map(|l| l.holders.iter().map(|h| h.fencing_token))
        .collect();
    assert_eq!(holders, [token], "the hold survives: {lock:?}");

    let client = Client::connect(&members_url(&[port])).await.unwrap();
    let next = client.lock(format!("{name}/next")).acquire().await.unwrap();
    assert!(next.fencing_token() > token, "tokens never go back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_record_kind_stays_unused_until_every_member_reads_it_then_turns_on() {
    let ports: Vec<u16> = (0..2).map(|_| free_port()).collect();
    let newer = ServerProcess::start_member(&ports, 0, &[]);
    // A member of the build before: it reads record version 1 only.
    let older = ServerProcess::start_member(&ports, 1, &["--record-version", "1"]);
    let members = [newer, older];
    leader(&members, &[]).await;
    let url = members_url(&ports);
    let mut status = cluster_status(&url).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while record_versions(&status) != [Some(3), Some(1)] {
        assert!(
            tokio::time::Instant::now() < deadline,
            "announced: {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        status = cluster_status(&url).await;
    }
    // The leader compares once a second: two of its rounds, and the gate
    // stays shut while a member reads version 1 only.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let status = cluster_status(&url).await;
    assert_eq!(status["cluster_version"], 1, "{status}");
    members[1].assert_running();

    // The older member is upgraded: the newer kind turns on.
    members[1].stop();
    let id = "2".to_string();
    let list = cluster_flag(&ports);
    let upgraded = members[1].start_again_on_port_with(&["--node-id", &id, "--cluster", &list]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let status = cluster_status(&url).await;
        if status["cluster_version"] == 3 {
            assert_eq!(record_versions(&status), [Some(3), Some(3)], "{status}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not raised: {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The upgraded member has applied the raise too (a member answers
    // `status` as it knows the cluster): stopped with the raise in its log
    // but not known to it as committed, it would start, and stop only once
    // the leader told it.
    let upgraded_url = members_url(&ports[1..]);
    while cluster_status(&upgraded_url).await["cluster_version"] != 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the upgraded member did not apply the raise"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Once it is on, a member of the older build cannot follow: it stops
    // and says why, rather than meet records it cannot read.
    upgraded.stop();
    let refused = members[1].refused(&[
        "--node-id",
        &id,
        "--cluster",
        &list,
        "--record-version",
        "1",
    ]);
    assert!(refused.contains("upgrade this member"), "{refused}");
}
