//! The log thread: writes and fsyncs what the core thread hands over, then
//! sends the replies that waited for it, so the core goes on with the next
//! batch while the disk works (pipelined group commit).
//!
//! The core hands over one [`Commit`] per engine batch: its log records and
//! its [`Output`]. The log thread takes every commit queued so far, writes
//! their records with **one** `fdatasync`, and only then sends their outputs,
//! in order. Commits that queue while an fsync runs share the next one, so
//! under load the disk is never idle and never waits for the engine.
//!
//! Under light load (a batch of a few requests and nothing in flight) the core
//! commits by itself instead ([`Committer::is_idle`]): handing over would add a
//! thread wake-up to the path of a single request.
//!
//! Only the core submits work, so once the log thread is idle it stays idle
//! until the core submits again: the core may then use the storage itself
//! (inline commits, snapshots) without ever waiting for an fsync in flight.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::core::Stats;
use crate::outbox::{Orphan, Output};
use crate::storage::Storage;

/// One engine batch's records and what it sends once they are durable.
pub(crate) struct Commit {
    /// Encoded log records (possibly none: the output then only waits for the
    /// commits before it).
    pub records: Vec<u8>,
    /// How many records.
    pub count: u64,
    /// What to send after the fsync.
    pub output: Output,
}

/// The core's handle on the log thread.
pub(crate) struct Committer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    queue: Mutex<Queue>,
    /// Wakes the log thread when work arrives.
    work: Condvar,
    /// Wakes the core when the log thread has nothing left.
    idle: Condvar,
    storage: Arc<Mutex<Storage>>,
    stats: Arc<Stats>,
}

#[derive(Default)]
struct Queue {
    pending: Vec<Commit>,
    /// A commit is being written.
    busy: bool,
    stop: bool,
    /// Why the log could not be written; nothing is sent after that.
    failed: Option<String>,
    /// Sessionless grants whose caller went away, for the core to release.
    orphans: Vec<Orphan>,
}

impl Committer {
    /// Starts the log thread on `storage`.
    pub(crate) fn start(
        storage: Arc<Mutex<Storage>>,
        stats: Arc<Stats>,
    ) -> std::io::Result<Committer> {
        let shared = Arc::new(Shared {
            queue: Mutex::default(),
            work: Condvar::new(),
            idle: Condvar::new(),
            storage,
            stats,
        });
        let thread = std::thread::Builder::new()
            .name("locksmith-log".into())
            .spawn({
                let shared = shared.clone();
                move || shared.run()
            })?;
        Ok(Committer {
            shared,
            thread: Some(thread),
        })
    }

    /// Queues a commit; `Err` with the reason once the log failed.
    pub(crate) fn submit(&self, commit: Commit) -> Result<(), String> {
        let mut queue = self.shared.lock();
        if let Some(failed) = &queue.failed {
            return Err(failed.clone());
        }
        queue.pending.push(commit);
        self.shared.work.notify_one();
        Ok(())
    }

    /// Whether nothing is queued or being written.
    pub(crate) fn is_idle(&self) -> bool {
        let queue = self.shared.lock();
        queue.pending.is_empty() && !queue.busy
    }

    /// Waits until everything submitted is durable and sent; `Err` with the
    /// reason if the log failed.
    pub(crate) fn drain(&self) -> Result<(), String> {
        let mut queue = self.shared.lock();
        while (!queue.pending.is_empty() || queue.busy) && queue.failed.is_none() {
            queue = self
                .shared
                .idle
                .wait(queue)
                .unwrap_or_else(|e| e.into_inner());
        }
        queue.failed.clone().map_or(Ok(()), Err)
    }

    /// Sessionless grants nobody received, and the failure of the log if it
    /// failed.
    pub(crate) fn collect(&self, orphans: &mut Vec<Orphan>) -> Result<(), String> {
        let mut queue = self.shared.lock();
        orphans.append(&mut queue.orphans);
        queue.failed.clone().map_or(Ok(()), Err)
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.work.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The log thread: one fsync for everything queued, then its outputs.
    fn run(&self) {
        loop {
            let commits = {
                let mut queue = self.lock();
                while queue.pending.is_empty() && !queue.stop {
                    queue = self.work.wait(queue).unwrap_or_else(|e| e.into_inner());
                }
                if queue.pending.is_empty() {
                    return; // stopped with nothing left
                }
                queue.busy = true;
                std::mem::take(&mut queue.pending)
            };
            let mut outputs = Vec::with_capacity(commits.len());
            let mut records = Vec::new();
            let mut count = 0;
            for commit in commits {
                if records.is_empty() {
                    records = commit.records;
                } else {
                    records.extend_from_slice(&commit.records);
                }
                count += commit.count;
                outputs.push(commit.output);
            }
            let written = {
                let mut storage = self.storage.lock().unwrap_or_else(|e| e.into_inner());
                commit_records(&mut storage, &records, count, &self.stats)
                    .and_then(|()| storage.prepare())
            };
            let mut orphans = Vec::new();
            if written.is_ok() {
                for output in outputs {
                    output.send(&mut orphans);
                }
            }
            let mut queue = self.lock();
            queue.busy = false;
            queue.orphans.append(&mut orphans);
            if let Err(error) = written {
                // Nothing of these batches may be seen: their state is not durable.
                queue.failed = Some(format!("cannot write the log: {error}"));
                queue.pending.clear();
                self.idle.notify_all();
                return;
            }
            if queue.pending.is_empty() {
                self.idle.notify_all();
            }
        }
    }
}

/// Writes and fsyncs `records` (if any), counting it in `stats`.
pub(crate) fn commit_records(
    storage: &mut Storage,
    records: &[u8],
    count: u64,
    stats: &Stats,
) -> std::io::Result<()> {
    if records.is_empty() {
        return Ok(());
    }
    let started = Instant::now();
    storage.commit(records)?;
    let nanos = started.elapsed().as_nanos() as u64;
    stats.commit_nanos.fetch_add(nanos, Ordering::Relaxed);
    stats.fsyncs.fetch_add(1, Ordering::Relaxed);
    stats.records.fetch_add(count, Ordering::Relaxed);
    Ok(())
}
