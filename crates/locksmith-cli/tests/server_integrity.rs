//! The data directory's integrity rules, against real `locksmith serve`
//! processes: the files are owner-only.

mod server_support;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use server_support::{unique, ServerProcess};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_files_are_owner_only() {
    // An existing directory open to everyone, as an earlier release left it.
    let server = ServerProcess::start_prepared(
        |data| {
            fs::create_dir(data).unwrap();
            fs::set_permissions(data, fs::Permissions::from_mode(0o755)).unwrap();
        },
        &[],
    );
    // A session: its resume secret is in the log.
    let client = server.client(Duration::from_secs(5)).await;
    let guard = client.lock(unique("modes")).acquire().await.unwrap();

    for (path, mode) in modes(&server.data_dir()) {
        let expected = if path.is_dir() { 0o700 } else { 0o600 };
        assert_eq!(mode, expected, "{} has mode {mode:o}", path.display());
    }
    let log = server.log_tail(200);
    assert!(
        log.contains("the data directory was open to other users: made owner-only"),
        "{log}"
    );
    guard.release().await.unwrap();
}
