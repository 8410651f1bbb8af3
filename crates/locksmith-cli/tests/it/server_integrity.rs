//! The data directory's integrity rules, against real `locksmith serve`
//! processes: damage before acknowledged data and missing files stop the
//! server with a message naming the file (and byte offset) and leave the
//! files as they are; `--recover-damaged-data` starts anyway and never hands
//! out a fencing token twice; a torn tail is cut with every acknowledged
//! grant kept; the files are owner-only.
//!
//! The tests damage the files as the `storage` module of `locksmith-server`
//! documents them: the Raft log's segments are in `raft/`, each a 24-byte
//! header, then frames `[len: u32 LE][crc: u32][header crc: u32][payload]`,
//! one per append, then zeros; `snapshot` and `TOKENS` are beside `raft/`.
//!
//! Needs the CLI binary, so it lives in locksmith-cli and not with the
//! server's own tests in locksmith-server: it starts `locksmith serve` as a
//! process, to test the server as an operator runs it (flags, data
//! directory, signals, restarts).

use crate::server_support;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use locksmith::{Client, Guard};
use locksmith_testkit::free_port;
use server_support::{eventually, metric, refused_start, unique, ServerProcess};

const SEGMENT_HEADER: usize = 24;
const FRAME_HEADER: usize = 12;

/// Every file and directory under `dir` (itself included) with its mode.
fn modes(dir: &Path) -> Vec<(PathBuf, u32)> {
    let mut found = vec![(dir.to_owned(), mode(dir))];
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(modes(&path));
        } else {
            found.push((path.clone(), mode(&path)));
        }
    }
    found
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// Every file under `dir` with its bytes.
fn contents(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(contents(&path));
        } else {
            files.push((path.clone(), fs::read(&path).unwrap()));
        }
    }
    files.sort();
    files
}

/// The log segments of `data`, oldest first.
fn segments(data: &Path) -> Vec<PathBuf> {
    let mut segments: Vec<PathBuf> = fs::read_dir(data.join("raft"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with("log-"))
        .collect();
    segments.sort();
    segments
}

/// Where each frame of a segment starts and ends.
fn frames(segment: &Path) -> Vec<(usize, usize)> {
    let bytes = fs::read(segment).unwrap();
    let mut frames = Vec::new();
    let mut at = SEGMENT_HEADER;
    while at + 4 <= bytes.len() && bytes[at..at + 4] != [0; 4] {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        frames.push((at, at + FRAME_HEADER + len));
        at += FRAME_HEADER + len;
    }
    frames
}

/// Grants `count` locks with long names (so that frames are large), releases
/// them, and returns the highest token.
async fn churn(client: &Client, count: usize) -> u64 {
    let base = unique("churn");
    let mut top = 0;
    for i in 0..count {
        let name = format!("{base}/{i}/{}", "x".repeat(300));
        let guard = client.lock(name).acquire().await.unwrap();
        top = top.max(guard.fencing_token());
        guard.release().await.unwrap();
    }
    top
}

/// A server that granted and released `count` locks and was then killed
/// (kill -9, so its newest segment holds those commits); and the highest
/// token it handed out.
async fn killed_after(count: usize, extra: &[&str]) -> (ServerProcess, u64) {
    let server = ServerProcess::start_with(extra);
    let client = server.client(Duration::from_secs(5)).await;
    let top = churn(&client, count).await;
    drop(client);
    server.kill();
    (server, top)
}

/// The newest segment of a killed server, with its frames.
fn newest(server: &ServerProcess) -> (PathBuf, Vec<(usize, usize)>) {
    let segment = segments(&server.data_dir()).pop().unwrap();
    let frames = frames(&segment);
    assert!(frames.len() >= 10, "{} frames", frames.len());
    (segment, frames)
}

/// The server refuses to start with a message containing each of
/// `expected`, and leaves every file as it was; with `--recover-damaged-data`
/// it starts, keeps the files as found in `damaged-*/`, and every token it
/// hands out is above `top`, the highest it handed out before.
async fn refuses_then_recovers(server: &ServerProcess, expected: &[&str], top: u64) {
    let data = server.data_dir();
    let before = contents(&data);
    let output = server.refused(&[]);
    for text in expected {
        assert!(output.contains(text), "{text:?} not in:\n{output}");
    }
    assert!(output.contains("--recover-damaged-data"), "{output}");
    assert_eq!(contents(&data), before, "the refused start changed files");

    let recovered = server.start_again_with(&["--recover-damaged-data"]);
    let evidence = fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("damaged-")
        })
        .unwrap_or_else(|| panic!("no damaged-* directory:\n{}", recovered.log_tail(40)));
    for (path, bytes) in &before {
        let relative = path.strip_prefix(&data).unwrap();
        if relative != Path::new("LOCK") {
            let kept = fs::read(evidence.join(relative)).unwrap();
            assert_eq!(&kept, bytes, "{}", relative.display());
        }
    }
    let client = recovered.client(Duration::from_secs(5)).await;
    for i in 0..3 {
        let guard = client
            .lock(unique(&format!("after-recovery-{i}")))
            .acquire()
            .await
            .unwrap();
        assert!(
            guard.fencing_token() > top,
            "token {} after a forced recovery, {top} handed out before",
            guard.fencing_token()
        );
        guard.release().await.unwrap();
    }
    let log = recovered.log_tail(200);
    assert!(
        log.contains("recovering what comes before the damage"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_bit_in_the_middle_of_the_log_stops_the_server() {
    let (server, top) = killed_after(20, &[]).await;
    let (segment, frames) = newest(&server);
    let (start, end) = frames[frames.len() / 2];
    let mut bytes = fs::read(&segment).unwrap();
    bytes[(start + end) / 2] ^= 0x04;
    fs::write(&segment, bytes).unwrap();
    let name = segment.file_name().unwrap().to_str().unwrap();
    let at = format!("at byte {start}, and a valid frame follows at byte {end}");
    refuses_then_recovers(&server, &[name, &at], top).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_length_in_the_middle_of_the_log_stops_the_server() {
    let (server, top) = killed_after(20, &[]).await;
    let (segment, frames) = newest(&server);
    let (start, _) = frames[frames.len() / 2];
    // A length that ends the frame in the zeros after the last one.
    let last_end = frames.last().unwrap().1;
    let len = (last_end + 100 - start - FRAME_HEADER) as u32;
    let mut bytes = fs::read(&segment).unwrap();
    bytes[start..start + 4].copy_from_slice(&len.to_le_bytes());
    fs::write(&segment, bytes).unwrap();
    let name = segment.file_name().unwrap().to_str().unwrap();
    refuses_then_recovers(&server, &[name, &format!("at byte {start}")], top).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zeroed_block_in_the_middle_of_the_log_stops_the_server() {
    let (server, top) = killed_after(40, &[]).await;
    let (segment, frames) = newest(&server);
    let block = 8192;
    assert!(frames.last().unwrap().0 > block + 4096, "{frames:?}");
    let hit = frames.iter().find(|&&(_, end)| end > block).unwrap().0;
    let mut bytes = fs::read(&segment).unwrap();
    bytes[block..block + 4096].fill(0);
    fs::write(&segment, bytes).unwrap();
    let name = segment.file_name().unwrap().to_str().unwrap();
    refuses_then_recovers(&server, &[name, &format!("at byte {hit}")], top).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_snapshot_stops_the_server() {
    // Frequent snapshots: the log is purged into them, so the snapshot alone
    // holds the state up to the purge. The kill waits for the server to say
    // that a purge is durable: killed before, it rightly starts from its
    // whole log, with or without the snapshot.
    let http = free_port();
    let listen = format!("127.0.0.1:{http}");
    let server = ServerProcess::start_with(&[
        "--snapshot-every",
        "5",
        "--snapshot-log-percent",
        "0",
        "--metrics-listen",
        &listen,
    ]);
    let client = server.client(Duration::from_secs(5)).await;
    let top = churn(&client, 10).await;
    eventually(Duration::from_secs(10), "a durable purge", || async {
        metric(http, "locksmith_raft_purged_index", &[]).await >= 5.0
    })
    .await;
    let purged = metric(http, "locksmith_raft_purged_index", &[]).await;
    let snapshot = metric(http, "locksmith_raft_snapshot_index", &[]).await;
    assert!(
        snapshot >= purged,
        "snapshot at {snapshot}, log purged to {purged}"
    );
    drop(client);
    server.kill();

    let snapshot = server.data_dir().join("snapshot");
    fs::remove_file(&snapshot).unwrap();
    // What a kill while the next snapshot was written leaves: the refused
    // start keeps it too, and the recovery keeps it as found.
    fs::write(server.data_dir().join("snapshot.tmp"), b"half a snapshot").unwrap();
    let missing = format!("missing {}", snapshot.display());
    refuses_then_recovers(&server, &[&missing], top).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_newest_segment_stops_the_server() {
    // Every token of this run is in the segment deleted: only the durable
    // token ceiling keeps the recovered server from handing them out again.
    let (server, top) = killed_after(10, &[]).await;
    let segment = segments(&server.data_dir()).pop().unwrap();
    fs::remove_file(&segment).unwrap();
    let missing = format!("missing {}", segment.display());
    refuses_then_recovers(&server, &[&missing], top).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_middle_segment_stops_the_server() {
    let (server, top) = killed_after(20, &["--segment-bytes", "2000"]).await;
    let all = segments(&server.data_dir());
    assert!(all.len() >= 3, "{all:?}");
    let middle = &all[all.len() / 2];
    fs::remove_file(middle).unwrap();
    let missing = format!("missing {}", middle.display());
    refuses_then_recovers(&server, &[&missing], top).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_token_ceiling_stops_the_server_even_with_the_recovery_flag() {
    let (server, _) = killed_after(5, &[]).await;
    let tokens = server.data_dir().join("TOKENS");
    fs::remove_file(&tokens).unwrap();
    let before = contents(&server.data_dir());
    for extra in [&[][..], &["--recover-damaged-data"][..]] {
        let output = server.refused(extra);
        let missing = format!("missing {}", tokens.display());
        assert!(output.contains(&missing), "{output}");
        assert!(output.contains("restore TOKENS from a backup"), "{output}");
        assert_eq!(contents(&server.data_dir()), before);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_of_the_single_server_layout_is_refused() {
    // What a development version before the Raft log left: segments of
    // frames at the top of the directory, no `raft/`.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let segment = dir.path().join("log-00000000000000000001");
    let mut bytes = vec![3, 0, 0, 0, 0x14, 0x65, 0x8a, 0x12, 1, 2, 3];
    bytes.resize(4096, 0);
    fs::write(&segment, &bytes).unwrap();
    let output = refused_start(dir.path(), &[]);
    assert!(output.contains("single server's layout"), "{output}");
    assert!(output.contains("start with an empty directory"), "{output}");
    assert_eq!(fs::read(&segment).unwrap(), bytes);
}

/// Holds three locks across a kill -9 and a restart after `damage` changed
/// the newest segment as a crash could: the restarted server has every
/// acknowledged grant, with its token, and hands out higher ones.
async fn acknowledged_grants_survive(damage: impl FnOnce(&Path, &[(usize, usize)])) {
    let server = ServerProcess::start_with(&["--grace", "30s"]);
    let client = server.client(Duration::from_secs(5)).await;
    let base = unique("torn");
    let mut held: Vec<(String, Guard)> = Vec::new();
    for i in 0..3 {
        let name = format!("{base}/held-{i}");
        held.push((name.clone(), client.lock(name).acquire().await.unwrap()));
    }
    let top = churn(&client, 5).await;
    server.kill();
    let (segment, frames) = newest(&server);
    damage(&segment, &frames);
    server.restart();

    for (name, guard) in &held {
        let info = loop {
            match client.describe(name).await {
                Ok(Some(info)) => break info,
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        assert_eq!(info.holders[0].fencing_token, Some(guard.fencing_token()));
        assert!(!guard.is_lost());
    }
    let fresh = client
        .lock(format!("{base}/fresh"))
        .acquire()
        .await
        .unwrap();
    assert!(fresh.fencing_token() > top);
    let log = server.log_tail(500);
    assert!(log.contains("an incomplete last write"), "{log}");
    for (_, guard) in held {
        guard.release().await.unwrap();
    }
    fresh.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_last_frame_is_cut_and_acknowledged_grants_survive() {
    acknowledged_grants_survive(|segment, frames| {
        let (start, end) = *frames.last().unwrap();
        let file = fs::OpenOptions::new().write(true).open(segment).unwrap();
        file.set_len(((start + end) / 2) as u64).unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_after_the_last_frame_is_cut_and_acknowledged_grants_survive() {
    acknowledged_grants_survive(|segment, frames| {
        let end = frames.last().unwrap().1;
        let mut bytes = fs::read(segment).unwrap();
        bytes[end + 700..end + 764].fill(0xa5);
        fs::write(segment, bytes).unwrap();
    })
    .await;
}

/// Starts a server on a data directory set up by `prepare`, takes a lock
/// (its session's resume secret goes into the log), checks that every
/// directory and file of the data directory is owner-only, and returns the
/// server's log.
async fn owner_only_after_a_grant(prepare: impl FnOnce(&Path)) -> String {
    let server = ServerProcess::start_prepared(prepare, &[]);
    let client = server.client(Duration::from_secs(5)).await;
    let guard = client.lock(unique("modes")).acquire().await.unwrap();
    for (path, mode) in modes(&server.data_dir()) {
        let expected = if path.is_dir() { 0o700 } else { 0o600 };
        assert_eq!(mode, expected, "{} has mode {mode:o}", path.display());
    }
    guard.release().await.unwrap();
    server.log_tail(200)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_data_directory_is_made_owner_only_without_a_warning() {
    let log = owner_only_after_a_grant(|_| {}).await;
    assert!(!log.contains("open to other users"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_files_are_owner_only() {
    // An existing directory open to everyone, as an earlier release left it.
    let log = owner_only_after_a_grant(|data| {
        fs::create_dir(data).unwrap();
        fs::set_permissions(data, fs::Permissions::from_mode(0o755)).unwrap();
    })
    .await;
    assert!(
        log.contains("the data directory was open to other users: made owner-only"),
        "{log}"
    );
}
