//! The seed corpora of the fuzz targets in `fuzz/`, for tests that replay
//! them through the same entry points the targets call.

use std::path::PathBuf;

/// Every file of `fuzz/seeds/<target>` in this repository, by name, with its
/// bytes: the inputs a campaign starts from, including every one that ever
/// made the target fail.
///
/// Panics when the directory is missing or empty, so that a replay never
/// passes by replaying nothing.
#[track_caller]
pub fn fuzz_seeds(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/seeds")
        .join(target);
    let entries = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read the seeds in {}: {e}", dir.display()));
    let mut seeds: Vec<(PathBuf, Vec<u8>)> = entries
        .map(|entry| {
            let path = entry.expect("a directory entry").path();
            let bytes = std::fs::read(&path)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
            (path, bytes)
        })
        .collect();
    assert!(!seeds.is_empty(), "no seeds in {}", dir.display());
    seeds.sort();
    seeds
}
