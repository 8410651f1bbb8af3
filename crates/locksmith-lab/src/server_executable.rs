//! Where the `locksmith` executable is, which the lab runs as the lock server
//! (`locksmith serve`) and to change a cluster's members (`locksmith
//! cluster`), and what the command line adds to its `serve`.
//!
//! The lab does not link the server's command line: it runs the binary
//! operators run, so a benchmark or a torture measures exactly what ships.
//! It is, in order: the one named by `--locksmith PATH` (or `LOCKSMITH_BIN`);
//! the one beside this executable (`cargo build` puts both in the same
//! directory of the target directory); the first on `PATH` (`cargo install`).

use std::path::PathBuf;
use std::sync::OnceLock;

/// The executable named on the command line, set once by `main`.
static CHOSEN: OnceLock<PathBuf> = OnceLock::new();

/// Arguments added to every `locksmith serve`, set once by `main`.
static SERVE_ARGS: OnceLock<Vec<String>> = OnceLock::new();

/// Adds `args` to every `locksmith serve` from now on (`--serve-arg`).
pub fn add_serve_args(args: Vec<String>) {
    // Set once, before anything runs: a second call cannot happen.
    let _ = SERVE_ARGS.set(args);
}

/// What `--serve-arg` added, in order.
pub fn serve_args() -> &'static [String] {
    SERVE_ARGS.get().map_or(&[], Vec::as_slice)
}

/// Runs `path` as the server from now on (`--locksmith PATH`).
pub fn choose(path: PathBuf) {
    // Set once, before anything runs: a second call cannot happen.
    let _ = CHOSEN.set(path);
}

/// The `locksmith` executable, or an error that says how to get one.
pub fn path() -> Result<PathBuf, String> {
    if let Some(chosen) = CHOSEN.get() {
        return if chosen.is_file() {
            Ok(chosen.clone())
        } else {
            Err(format!("--locksmith {}: no such file", chosen.display()))
        };
    }
    let beside = std::env::current_exe()
        .ok()
        .map(|lab| lab.with_file_name("locksmith"));
    if let Some(beside) = beside.filter(|path| path.is_file()) {
        return Ok(beside);
    }
    locksmith_testkit::try_binary("locksmith", "locksmith").map_err(|_| {
        "cannot find the `locksmith` executable, neither beside this one nor on PATH; \
         build it with `cargo build --release -p locksmith-cli` (or \
         `cargo install --path crates/locksmith-cli`), or name it with --locksmith PATH \
         or LOCKSMITH_BIN"
            .to_owned()
    })
}
