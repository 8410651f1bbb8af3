//! A member's data directory made of arbitrary files, opened as a start does
//! (and as `--recover-damaged-data` does): it loads, or stops with an error
//! naming what is wrong; it never panics (`locksmith_server::fuzzing::data_dir`,
//! which writes the files in the documented formats so that the fuzzer gets
//! past the checksums, and whose tests replay the seeds).
#![no_main]

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

const SCRATCH_PREFIX: &str = "locksmith-fuzz-data-dir-";

/// A directory of this process's own, on tmpfs when there is one (a start
/// fsyncs, and writes a new segment of zeros).
///
/// libFuzzer ends the process without running destructors, so the last
/// input's directory stays; the first call removes those of processes that
/// are gone, so that runs do not pile them up in memory.
fn scratch() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let shm = Path::new("/dev/shm");
        let base = if shm.is_dir() {
            shm.to_owned()
        } else {
            std::env::temp_dir()
        };
        remove_orphans(&base);
        base.join(format!("{SCRATCH_PREFIX}{}", std::process::id()))
    })
}

/// Removes the scratch directories in `base` whose process has ended.
fn remove_orphans(base: &Path) {
    let Ok(entries) = fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(SCRATCH_PREFIX)) else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

fuzz_target!(|bytes: &[u8]| {
    locksmith_server::fuzzing::data_dir(bytes, scratch());
});
