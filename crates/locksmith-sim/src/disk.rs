//! Each member's disk, as a power loss and a slow disk see it
//! (`--power-loss`, `--slow-disks`): the member's Raft log is written
//! through a write-back cache of the simulation's
//! (`locksmith_server::WriteCache`, given in its `Environment`).
//!
//! The server writes its log's segments to real files (in a temporary
//! directory, on `/dev/shm` where there is one); the cache is told of each
//! write before it is made, and keeps what the bytes were, until the file
//! is synced. Between a commit's write and its sync the log's writer waits
//! for the disk ([`WriteCache::sync`]): the member's sync latency, drawn
//! per member (1–10 ms), or far longer while a slow-disk fault lasts. A
//! crash that strikes meanwhile is a power loss: what was written and not
//! synced is put back as it was, all of it or from a random byte on (a
//! torn write: a prefix of the writes, in the order they were made,
//! survives). The writer tells nobody a commit is durable before its sync,
//! so a member must keep every entry and vote it acknowledged.
//!
//! Only the log's frames go through the cache: a segment's creation, the
//! manifest, the snapshot and the token ceiling are written and synced in
//! one step each, so a crash (which lands between two steps of the
//! simulation) never finds them half done.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use locksmith_server::{Syncing, WriteCache};
use rand::rngs::SmallRng;
use rand::Rng;

/// A write not synced yet: where, and what was there before.
struct Unsynced {
    path: PathBuf,
    offset: u64,
    len: u64,
    /// The bytes it covers as they were (fewer than `len` if the file was
    /// shorter).
    before: Vec<u8>,
    /// The file's length before it.
    length_before: u64,
}

#[derive(Default)]
struct State {
    /// In the order they were made.
    unsynced: Vec<Unsynced>,
    /// How long a sync takes.
    latency: Duration,
    /// How long it takes while no fault slows the disk.
    usual: Duration,
}

/// One member's disk; it outlives the member's restarts.
#[derive(Clone, Default)]
pub struct Disk {
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for Disk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Disk")
            .field("latency", &self.latency())
            .finish_non_exhaustive()
    }
}

impl Disk {
    /// A disk whose syncs take `latency`.
    pub fn new(latency: Duration) -> Disk {
        let disk = Disk::default();
        disk.set_latency(latency);
        disk.state().usual = latency;
        disk
    }

    /// Its syncs' latency while no fault slows it.
    pub fn usual_latency(&self) -> Duration {
        self.state().usual
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes its syncs take `latency` from now on.
    pub fn set_latency(&self, latency: Duration) {
        self.state().latency = latency;
    }

    /// Its syncs' latency.
    pub fn latency(&self) -> Duration {
        self.state().latency
    }

    /// Whether something written is not synced yet: the disk is busy.
    pub fn busy(&self) -> bool {
        !self.state().unsynced.is_empty()
    }

    /// A power loss (the member's host has just crashed): what was written
    /// and not synced is put back as it was, from a byte drawn from `rng`
    /// on. What was lost, if anything.
    pub fn lose_unsynced(&self, rng: &mut SmallRng) -> Option<String> {
        let unsynced = std::mem::take(&mut self.state().unsynced);
        if unsynced.is_empty() {
            return None;
        }
        let total: u64 = unsynced.iter().map(|w| w.len).sum();
        let kept = rng.gen_range(0..=total);
        // The last writes first, so that what an earlier write left is
        // what stays.
        let mut before_this = total;
        for write in unsynced.iter().rev() {
            before_this -= write.len;
            let keep = kept.saturating_sub(before_this).min(write.len);
            if keep < write.len {
                put_back(write, keep)
                    .unwrap_or_else(|e| panic!("cannot put back {}: {e}", write.path.display()));
            }
        }
        let file = unsynced[0]
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Some(format!(
            "{kept} of {total} bytes written to {file} and not synced survive"
        ))
    }
}

/// Puts `write`'s bytes back as they were, from `keep` bytes on.
fn put_back(write: &Unsynced, keep: u64) -> std::io::Result<()> {
    let file = OpenOptions::new().write(true).open(&write.path)?;
    let from = write.offset + keep;
    let before_from = (keep as usize).min(write.before.len());
    file.write_all_at(&write.before[before_from..], from)?;
    let end = write.offset + write.len;
    if end > write.length_before {
        let length = file.metadata()?.len();
        let cut = write.length_before.max(from);
        if length > cut {
            file.set_len(cut)?;
        }
    }
    Ok(())
}

impl WriteCache for Disk {
    fn writing(&self, path: &Path, offset: u64, len: u64) {
        let (before, length_before) = match File::open(path) {
            Ok(file) => {
                let length = file.metadata().map(|m| m.len()).unwrap_or(0);
                let end = length.min(offset + len);
                let mut before = vec![0; end.saturating_sub(offset) as usize];
                if !before.is_empty() {
                    file.read_exact_at(&mut before, offset)
                        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
                }
                (before, length)
            }
            Err(_) => (Vec::new(), 0),
        };
        self.state().unsynced.push(Unsynced {
            path: path.to_owned(),
            offset,
            len,
            before,
            length_before,
        });
    }

    fn synced(&self, path: &Path) {
        self.state().unsynced.retain(|w| w.path != path);
    }

    fn sync(&self) -> Syncing {
        let latency = self.latency();
        Box::pin(tokio::time::sleep(latency))
    }
}
