//! The Raft log of a member: openraft's [`RaftLogStorage`] over the same
//! segments as the single server's log (module docs of [`super`]): frames
//! over pre-written zeros, one `fdatasync` per commit, a torn tail cut, damage
//! before valid frames and missing segments refused. A writer of its own (a
//! task, or a thread) makes appends durable while openraft goes on (see
//! [`RaftLog`]).
//!
//! # Files, in `<data dir>/raft/`
//!
//! | file | content |
//! |---|---|
//! | `RAFTLOG` | checked file: the segments the log is in (`first ..= last`) |
//! | `log-<seq>` | segments whose frames hold [`RaftRecord`]s |
//!
//! The log is a sequence of records replayed in order on open: entries,
//! truncations of a conflicting suffix, purges up to a snapshot, votes, the
//! committed id. Nothing is rewritten in place: a truncation is a record, so
//! a crash in the middle of one leaves either the old log or the new one.
//! Each segment starts by restating the vote, the purge point and the
//! committed id, so that a segment whose entries are all purged can be
//! deleted (only from the front: a truncation record in a later segment may
//! refer to entries of an earlier one) without losing them.
//!
//! Every start opens a new segment. The entries since the last purge are
//! kept in memory too (openraft reads them to replicate); openraft purges
//! after each snapshot, which bounds them.
//!
//! Cancel safety of every method: the submission is queued before the first
//! await; a vote, truncation or purge is durable once its method returns, an
//! append once openraft's callback hears so. A crash in the middle of a
//! write leaves a torn tail at worst, cut on the next start (never
//! acknowledged to openraft).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs;
use std::io;
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::type_config::alias::{EntryOf, LogIdOf, VoteOf};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use super::files::{self, io_error, list_segments, segment_path};
use super::segment::{LogBuffer, Segment};
use crate::config::Execution;
use crate::entry::TypeConfig;
use crate::environment::WriteCache;
use crate::error::ServerError;

const MANIFEST_MAGIC: &[u8; 4] = b"LSRL";
const MANIFEST: &str = "RAFTLOG";

/// One record of the Raft log.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum RaftRecord {
    /// An entry, appended (replacing any entry at its index).
    Entry(EntryOf<TypeConfig>),
    /// Entries after this log id (all, for `None`) are void.
    TruncateAfter(Option<LogIdOf<TypeConfig>>),
    /// Entries up to and including this log id are in a snapshot: gone.
    Purge(LogIdOf<TypeConfig>),
    /// The vote, as saved last.
    Vote(VoteOf<TypeConfig>),
    /// The committed log id, as saved last.
    Committed(Option<LogIdOf<TypeConfig>>),
}

/// [`RaftRecord::Entry`] over a borrowed entry: it encodes to the same
/// bytes, so an append writes its entries without copying them first.
struct EntryRecord<'a>(&'a EntryOf<TypeConfig>);

impl Serialize for EntryRecord<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_newtype_variant("RaftRecord", 0, "Entry", self.0)
    }
}

impl super::SegmentRecord for RaftRecord {
    fn decode_frame(_format: u32, payload: &[u8]) -> Result<Vec<RaftRecord>, postcard::Error> {
        super::segment::decode_records(payload)
    }
}

/// What `RAFTLOG` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Manifest {
    first_segment: u64,
    /// Below `first_segment` when there is none.
    last_segment: u64,
}

/// The Raft log, shared by openraft's writer and the readers it takes.
///
/// Appends are visible to readers at once and made durable by the log's own
/// writer (a thread, or a task where nothing it does blocks:
/// [`ReadLog::start`]), which calls openraft back once they are: openraft's core
/// does not wait for the disk, so a leader sends entries to its followers
/// while its own `fdatasync` runs, and appends that arrive during one fsync
/// share the next (group commit). Votes, truncations and purges wait for the
/// disk before they return. Everything reaches the disk in the order it was
/// submitted.
#[derive(Clone)]
pub(crate) struct RaftLog {
    shared: Arc<Shared>,
}

struct Shared {
    /// What openraft reads: the log as submitted, durable or not yet.
    memory: Mutex<Memory>,
    queue: Arc<Queue>,
    /// The writer thread, if it is one, joined when the last handle goes.
    writer: Mutex<Option<JoinHandle<()>>>,
    /// Bytes of entries appended since the log was opened (the
    /// snapshot policy's measure of the log's growth).
    appended: AtomicU64,
}

/// The log as openraft last changed it.
struct Memory {
    /// Entries not purged, by index.
    entries: BTreeMap<u64, EntryOf<TypeConfig>>,
    purged: Option<LogIdOf<TypeConfig>>,
    vote: Option<VoteOf<TypeConfig>>,
    committed: Option<LogIdOf<TypeConfig>>,
}

/// What waits for the writer.
struct Queue {
    state: Mutex<Pending>,
    wake: Wake,
}

/// How a submission wakes the writer: a thread ([`Execution::Threads`])
/// waits on a condition variable, a task on a notification.
enum Wake {
    Thread(Condvar),
    Task(tokio::sync::Notify),
}

impl Wake {
    fn wake(&self) {
        match self {
            Wake::Thread(condvar) => condvar.notify_one(),
            Wake::Task(notify) => notify.notify_one(),
        }
    }
}

/// What the writer takes from the queue to write at once.
struct Taken {
    frames: Vec<u8>,
    changes: Vec<DiskChange>,
    waiting: Vec<Completion>,
    closed: bool,
}

#[derive(Default)]
struct Pending {
    /// The records, encoded in submission order.
    buffer: LogBuffer,
    /// What each submission changes on disk beyond its records, in order.
    changes: Vec<DiskChange>,
    /// Who to tell once the records are durable.
    waiting: Vec<Completion>,
    /// The first write that failed: nothing is written after it.
    failed: Option<String>,
    /// The last handle is gone: write what is pending, then stop.
    closed: bool,
}

/// What a submission changes in the writer's view of the files.
enum DiskChange {
    /// Entries up to this index went into the current segment.
    Entries {
        last: u64,
    },
    Truncate(Option<LogIdOf<TypeConfig>>),
    Purge(LogIdOf<TypeConfig>),
    Vote(VoteOf<TypeConfig>),
    Committed(Option<LogIdOf<TypeConfig>>),
}

enum Completion {
    /// openraft's callback for an append.
    Flushed(IOFlushed<TypeConfig>),
    /// A method that waits for the disk.
    Done(oneshot::Sender<io::Result<()>>),
}

impl Completion {
    fn complete(self, result: &Result<(), String>) {
        let result = result.clone().map_err(io::Error::other);
        match self {
            Completion::Flushed(callback) => callback.io_completed(result),
            Completion::Done(done) => {
                let _ = done.send(result);
            }
        }
    }
}

/// The segment files, owned by the writer once the log has started.
struct Disk {
    dir: PathBuf,
    manifest: Manifest,
    segment: Segment,
    /// The highest index each segment (`first..=last`) holds an entry of.
    segment_last_index: BTreeMap<u64, u64>,
    /// As written last: restated at the start of every segment.
    purged: Option<LogIdOf<TypeConfig>>,
    vote: Option<VoteOf<TypeConfig>>,
    committed: Option<LogIdOf<TypeConfig>>,
    /// Records of the log's own (restatements, a recovery's entries).
    buffer: LogBuffer,
    segment_bytes: u64,
    /// A simulated disk's write-back cache (`Environment::write_cache`):
    /// the writer task waits for its sync between a commit's write and its
    /// `fdatasync`.
    write_cache: Option<Arc<dyn WriteCache>>,
    /// The log is on a memory filesystem (`files::on_memory_filesystem`):
    /// the writer is a task that writes and syncs in place, since a copy
    /// into memory costs less than a thread's wake-up per commit. A commit
    /// is then a copy of its own size (its zeros ahead come 256 KiB at a
    /// time): microseconds for the usual batch, a few milliseconds for the
    /// biggest, well inside a heartbeat interval.
    in_memory: bool,
}

impl RaftLog {
    /// Opens (creating if needed) the Raft log in `dir`, its writer on a
    /// thread of its own: checks it against
    /// its manifest, replays it, cuts a torn tail, and starts a new segment.
    /// Anything that does not check out is an error naming the file and
    /// offset, and the files stay as they are.
    #[cfg(test)]
    pub(crate) fn open(dir: &Path, segment_bytes: u64) -> Result<RaftLog, ServerError> {
        RaftLog::open_on(dir, segment_bytes, Execution::Threads, None)
    }

    /// Opens the log in `dir` as `open` does, with its writer run as
    /// `execution` says, writing through `write_cache` if given.
    pub(crate) fn open_on(
        dir: &Path,
        segment_bytes: u64,
        execution: Execution,
        write_cache: Option<Arc<dyn WriteCache>>,
    ) -> Result<RaftLog, ServerError> {
        RaftLog::read(dir, false)?.start(segment_bytes, execution, write_cache)
    }

    /// Reads the log in `dir` without writing to it (but for a new log's
    /// manifest and the cut of a torn last frame), so that what a start
    /// checks next can still refuse with the files as they were; then
    /// [`ReadLog::start`] appends. With `recover` (a forced recovery, after
    /// the files were kept as evidence), it keeps every entry before the
    /// first damage or missing segment and drops the rest; the committed id
    /// is brought back to the last entry kept.
    pub(crate) fn read(dir: &Path, recover: bool) -> Result<ReadLog, ServerError> {
        files::make_owner_only(dir)?;
        let _ = fs::remove_file(dir.join(format!("{MANIFEST}.tmp")));
        let present = list_segments(dir)?;
        let manifest = match read_manifest(dir)? {
            Some(manifest) => manifest,
            None if present.is_empty() => {
                let manifest = Manifest {
                    first_segment: 1,
                    last_segment: 0,
                };
                write_manifest(dir, manifest).map_err(|e| io_error("cannot write", dir, e))?;
                manifest
            }
            None => {
                return Err(ServerError::Missing {
                    path: dir.join(MANIFEST),
                    detail: format!(
                        "the Raft log holds segments ({} among them) but no {MANIFEST}: this \
                         member cannot tell which entries it acknowledged; replace it with a new \
                         member (a new node id) and remove this one from the cluster",
                        segment_path(dir, present[0]).display()
                    ),
                })
            }
        };
        let newest = manifest
            .last_segment
            .max(present.last().copied().unwrap_or(0));
        if newest == u64::MAX {
            return Err(ServerError::Corrupt {
                path: segment_path(dir, newest),
                detail: "the last possible segment number: no segment can follow it".into(),
            });
        }
        let mut state = Replayed::default();
        let named = manifest.first_segment..=manifest.last_segment;
        let mut damaged = false;
        for seq in named.clone() {
            let replayed = if present.binary_search(&seq).is_err() {
                Err(ServerError::Missing {
                    path: segment_path(dir, seq),
                    detail: format!(
                        "{MANIFEST} says the Raft log is in segments {} to {}",
                        manifest.first_segment, manifest.last_segment
                    ),
                })
            } else {
                state.replay_segment(dir, seq, seq == manifest.last_segment)
            };
            match replayed {
                Ok(()) => {}
                Err(error @ (ServerError::Corrupt { .. } | ServerError::Missing { .. }))
                    if recover =>
                {
                    tracing::error!(
                        %error,
                        "recovering what comes before the damage: the entries after it are \
                         dropped from this member's log"
                    );
                    damaged = true;
                    break;
                }
                Err(error) => return Err(error),
            }
        }
        if damaged {
            let last = state.entries.keys().next_back().copied();
            if state.committed.as_ref().map(|c| c.index()) > last {
                state.committed = last.map(|i| state.entries[&i].log_id());
            }
        }
        Ok(ReadLog {
            dir: dir.to_owned(),
            manifest,
            present,
            state,
            damaged,
        })
    }
}

/// A Raft log read from disk, not written to yet.
pub(crate) struct ReadLog {
    dir: PathBuf,
    manifest: Manifest,
    present: Vec<u64>,
    state: Replayed,
    /// Read up to a damage (a forced recovery): what follows is dropped.
    damaged: bool,
}

impl ReadLog {
    /// Up to where the log was purged (into a snapshot).
    pub(crate) fn purged(&self) -> Option<LogIdOf<TypeConfig>> {
        self.state.purged
    }

    /// Starts appending: removes leftovers of interrupted writes, opens a
    /// new segment (after a forced recovery, one holding every entry kept,
    /// which alone is named) and starts the writer.
    ///
    /// The writer is a thread of its own with [`Execution::Threads`], and
    /// with [`Execution::Tasks`] (which must then be called within a
    /// runtime) whenever its writes block: a log on a disk, under a
    /// multi-thread runtime. Its wake-up per commit costs less than handing
    /// a worker's other tasks to another thread for each write and
    /// `fdatasync` (`block_in_place`), and no worker waits for the disk
    /// (docs/BENCHMARKS.md, "The Raft log's writer on a thread of its
    /// own"). Otherwise it is a task of the current runtime: on a memory
    /// filesystem, writing in place, and on a current-thread runtime (a
    /// simulation, with its simulated disk's write-back cache), where
    /// nothing else could run meanwhile anyway.
    pub(crate) fn start(
        self,
        segment_bytes: u64,
        execution: Execution,
        write_cache: Option<Arc<dyn WriteCache>>,
    ) -> Result<RaftLog, ServerError> {
        let ReadLog {
            dir,
            manifest,
            present,
            state,
            damaged,
        } = self;
        let dir = dir.as_path();
        let named = manifest.first_segment..=manifest.last_segment;
        // Leftovers of an interrupted segment change or purge. (After a
        // recovery the old segments go once the new one is named.)
        for &seq in present.iter().filter(|seq| !named.contains(seq)) {
            let path = segment_path(dir, seq);
            fs::remove_file(&path).map_err(|e| io_error("cannot remove", &path, e))?;
        }
        // Below u64::MAX: `read` refuses a log that leaves no next number.
        let next = manifest
            .last_segment
            .max(present.last().copied().unwrap_or(0))
            + 1;
        let mut disk = Disk {
            dir: dir.to_owned(),
            manifest,
            segment: Segment::create(dir, next, write_cache.clone())
                .map_err(|e| io_error("cannot create", dir, e))?,
            write_cache,
            segment_last_index: state.segment_last_index,
            purged: state.purged,
            vote: state.vote,
            committed: state.committed,
            buffer: LogBuffer::default(),
            segment_bytes: segment_bytes.max(1),
            in_memory: files::on_memory_filesystem(dir),
        };
        if damaged {
            // What is kept goes into the new segment, which alone is named.
            disk.manifest.first_segment = next;
            disk.segment_last_index.clear();
            if let Some((&last, _)) = state.entries.last_key_value() {
                disk.segment_last_index.insert(next, last);
            }
            for entry in state.entries.values() {
                disk.buffer.push(&EntryRecord(entry));
            }
        }
        disk.enter_segment(next)
            .map_err(|e| io_error("cannot write", dir, e))?;
        let on_a_thread = match execution {
            Execution::Threads => true,
            Execution::Tasks => {
                !disk.in_memory
                    && disk.write_cache.is_none()
                    && crate::blocking::on_multi_thread_runtime()
            }
        };
        let wake = if on_a_thread {
            Wake::Thread(Condvar::new())
        } else {
            Wake::Task(tokio::sync::Notify::new())
        };
        let queue = Arc::new(Queue {
            state: Mutex::new(Pending::default()),
            wake,
        });
        let writer = if on_a_thread {
            Some(
                std::thread::Builder::new()
                    .name("raft-log".into())
                    .spawn({
                        let queue = queue.clone();
                        move || queue.write_until_closed(disk)
                    })
                    .map_err(|e| io_error("cannot start the writer of", dir, e))?,
            )
        } else {
            // Ends by itself once the last handle closes the queue.
            tokio::spawn(queue.clone().write_until_closed_as_task(disk));
            None
        };
        Ok(RaftLog {
            shared: Arc::new(Shared {
                memory: Mutex::new(Memory {
                    entries: state.entries,
                    purged: state.purged,
                    vote: state.vote,
                    committed: state.committed,
                }),
                queue,
                writer: Mutex::new(writer),
                appended: AtomicU64::new(0),
            }),
        })
    }
}

/// What replaying the segments rebuilt.
#[derive(Default)]
struct Replayed {
    entries: BTreeMap<u64, EntryOf<TypeConfig>>,
    segment_last_index: BTreeMap<u64, u64>,
    purged: Option<LogIdOf<TypeConfig>>,
    vote: Option<VoteOf<TypeConfig>>,
    committed: Option<LogIdOf<TypeConfig>>,
}

impl Replayed {
    fn apply(&mut self, seq: u64, record: RaftRecord) {
        match record {
            RaftRecord::Entry(entry) => {
                let index = entry.index();
                let last = self.segment_last_index.entry(seq).or_insert(index);
                *last = (*last).max(index);
                self.entries.insert(index, entry);
            }
            RaftRecord::TruncateAfter(after) => {
                truncate(&mut self.entries, after);
                truncate_segments(&mut self.segment_last_index, after);
            }
            RaftRecord::Purge(upto) => {
                purge(&mut self.entries, upto);
                self.purged = Some(upto);
            }
            RaftRecord::Vote(vote) => self.vote = Some(vote),
            RaftRecord::Committed(committed) => self.committed = committed,
        }
    }

    fn replay_segment(&mut self, dir: &Path, seq: u64, newest: bool) -> Result<(), ServerError> {
        super::replay_segment(dir, seq, newest, |record| self.apply(seq, record))
    }
}

impl Queue {
    /// Adds a submission: `push` encodes its records into the buffer. Fails,
    /// adding nothing, once a write failed.
    fn submit(
        &self,
        push: impl FnOnce(&mut LogBuffer),
        change: DiskChange,
        completion: Option<Completion>,
    ) -> io::Result<()> {
        let mut pending = lock(&self.state);
        if let Some(failed) = &pending.failed {
            return Err(io::Error::other(failed.clone()));
        }
        push(&mut pending.buffer);
        pending.changes.push(change);
        if let Some(completion) = completion {
            pending.waiting.push(completion);
            // Woken after the lock is let go, so that it need not wait for it.
            drop(pending);
            self.wake.wake();
        }
        Ok(())
    }

    /// Submits and waits until the submission is durable.
    ///
    /// Cancel safety: a dropped future leaves the submission to be written.
    async fn submit_durably(
        &self,
        push: impl FnOnce(&mut LogBuffer),
        change: DiskChange,
    ) -> io::Result<()> {
        let (done, written) = oneshot::channel();
        self.submit(push, change, Some(Completion::Done(done)))?;
        written
            .await
            .map_err(|_| io::Error::other("the Raft log's writer stopped"))?
    }

    /// The writer thread: writes what is submitted, every submission that
    /// gathered meanwhile with one `fdatasync`, and tells who waits; stops
    /// once closed and everything is written.
    fn write_until_closed(&self, mut disk: Disk) {
        let Wake::Thread(condvar) = &self.wake else {
            unreachable!("a writer thread waits on a condition variable")
        };
        loop {
            let taken = {
                let mut pending = lock(&self.state);
                while pending.waiting.is_empty() && !pending.closed {
                    pending = condvar.wait(pending).unwrap_or_else(|e| e.into_inner());
                }
                take(&mut pending)
            };
            if self.write(&mut disk, taken) {
                return;
            }
        }
    }

    /// The writer as a task (see [`ReadLog::start`] for when): the same
    /// loop, awaiting the next submission instead of blocking. A log on a
    /// memory filesystem writes in place ([`Disk::in_memory`]); other
    /// writes and syncs run through `blocking::run`, in place on a
    /// current-thread runtime (a simulation's), and through
    /// `block_in_place` on a multi-thread one (only with a simulated
    /// disk's write-back cache there).
    /// With a simulated disk's write-back cache (`Environment::write_cache`)
    /// a commit is written, then the writer waits for the cache's sync (the
    /// disk's latency), then syncs it and tells who waits: a crash
    /// meanwhile finds it written and not synced.
    ///
    /// Cancel safety: dropped (its runtime gone), what was submitted and not
    /// written is lost, as in a crash; nothing is told it is durable.
    async fn write_until_closed_as_task(self: Arc<Self>, mut disk: Disk) {
        let Wake::Task(notify) = &self.wake else {
            unreachable!("a writer task waits on a notification")
        };
        loop {
            let taken = loop {
                {
                    let mut pending = lock(&self.state);
                    if !pending.waiting.is_empty() || pending.closed {
                        break take(&mut pending);
                    }
                }
                // A wake-up sent since the check above is kept for this.
                notify.notified().await;
            };
            let in_memory = disk.in_memory;
            let closed = match disk.write_cache.clone() {
                None => in_place_or_blocking(in_memory, || self.write(&mut disk, taken)),
                Some(cache) => {
                    // Written now and synced once the simulated disk has
                    // taken its time: a crash meanwhile may lose or tear
                    // the commit, which nobody was told is durable.
                    let mut taken = taken;
                    let written = if lock(&self.state).failed.is_some() {
                        Ok(false)
                    } else {
                        in_place_or_blocking(in_memory, || {
                            disk.segment.write_frames(&mut taken.frames)
                        })
                    };
                    if matches!(written, Ok(true)) {
                        cache.sync().await;
                    }
                    in_place_or_blocking(in_memory, || {
                        self.write_synced(&mut disk, taken, Some(written))
                    })
                }
            };
            if closed {
                return;
            }
        }
    }

    /// Writes what was taken as one commit and tells who waits; returns
    /// whether the queue was closed (the writer stops).
    fn write(&self, disk: &mut Disk, taken: Taken) -> bool {
        self.write_synced(disk, taken, None)
    }

    /// As [`Queue::write`]; with `written`, the commit's frames were written
    /// already (`Segment::write_frames`, with this outcome) and are synced
    /// here.
    fn write_synced(
        &self,
        disk: &mut Disk,
        taken: Taken,
        written: Option<io::Result<bool>>,
    ) -> bool {
        let Taken {
            mut frames,
            changes,
            waiting,
            closed,
        } = taken;
        let failed = lock(&self.state).failed.clone();
        let result = match failed {
            Some(failed) => Err(failed),
            None => match written {
                None => disk.write(&mut frames, changes),
                Some(Ok(written)) => disk.sync_and_finish(written, changes),
                Some(Err(error)) => Err(error),
            }
            .map_err(|e| {
                let failed = format!(
                    "the Raft log in {} could not be written: {e}; nothing after it is \
                     acknowledged",
                    disk.dir.display()
                );
                tracing::error!("{failed}");
                lock(&self.state).failed = Some(failed.clone());
                failed
            }),
        };
        for completion in waiting {
            completion.complete(&result);
        }
        lock(&self.state).buffer.give_back(frames);
        closed
    }
}

/// Runs `step` in place, or through `blocking::run` (a log that is not on
/// a memory filesystem: see `Disk::in_memory`).
fn in_place_or_blocking<T>(in_place: bool, step: impl FnOnce() -> T) -> T {
    if in_place {
        step()
    } else {
        crate::blocking::run(step)
    }
}

/// Takes everything pending, to be written as one commit.
fn take(pending: &mut Pending) -> Taken {
    let (frames, _) = pending.buffer.take();
    Taken {
        frames,
        changes: std::mem::take(&mut pending.changes),
        waiting: std::mem::take(&mut pending.waiting),
        closed: pending.closed,
    }
}

impl Drop for Shared {
    /// The last handle: the writer writes what is pending, then stops.
    fn drop(&mut self) {
        lock(&self.queue.state).closed = true;
        self.queue.wake.wake();
        if let Some(writer) = lock(&self.writer).take() {
            let _ = writer.join();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Disk {
    /// Makes `seq` (created already) the segment appended to: restates the
    /// vote, purge point and committed id in it, then names it in the
    /// manifest.
    fn enter_segment(&mut self, seq: u64) -> io::Result<()> {
        if let Some(vote) = self.vote {
            self.buffer.push(&RaftRecord::Vote(vote));
        }
        if let Some(purged) = self.purged {
            self.buffer.push(&RaftRecord::Purge(purged));
        }
        self.buffer.push(&RaftRecord::Committed(self.committed));
        let (mut frames, _) = self.buffer.take();
        self.segment.commit(&mut frames)?;
        self.segment.keep_zeros_ahead()?;
        self.manifest = Manifest {
            first_segment: self.manifest.first_segment.min(seq),
            last_segment: seq,
        };
        if self.segment_last_index.is_empty() && self.manifest.first_segment < seq {
            // No entry left in older segments: they can all go.
            self.manifest.first_segment = seq;
        }
        write_manifest(&self.dir, self.manifest)?;
        self.delete_before(self.manifest.first_segment)
    }

    /// Writes `frames` (submissions whose `changes` are given, in order) as
    /// one durable commit, then drops the segments a purge emptied and
    /// starts the next segment once the current one is full.
    fn write(&mut self, frames: &mut [u8], changes: Vec<DiskChange>) -> io::Result<()> {
        if !frames.is_empty() {
            self.segment.commit(frames)?;
        }
        self.finish(changes)
    }

    /// The second half of a commit whose frames were written already
    /// (`Segment::write_frames`, `written` if there were any): syncs them,
    /// then goes on as [`Disk::write`].
    fn sync_and_finish(&mut self, written: bool, changes: Vec<DiskChange>) -> io::Result<()> {
        if written {
            self.segment.sync()?;
        }
        self.finish(changes)
    }

    /// What follows a commit's sync: the zeros ahead, the changes the
    /// commit's submissions make, a purge's segments dropped, the next
    /// segment once this one is full.
    fn finish(&mut self, changes: Vec<DiskChange>) -> io::Result<()> {
        self.segment.keep_zeros_ahead()?;
        let seq = self.manifest.last_segment;
        let mut purged_now = false;
        for change in changes {
            match change {
                DiskChange::Entries { last } => {
                    let known = self.segment_last_index.entry(seq).or_insert(last);
                    *known = (*known).max(last);
                }
                DiskChange::Truncate(after) => {
                    truncate_segments(&mut self.segment_last_index, after)
                }
                DiskChange::Purge(upto) => {
                    self.purged = Some(upto);
                    purged_now = true;
                }
                DiskChange::Vote(vote) => self.vote = Some(vote),
                DiskChange::Committed(committed) => self.committed = committed,
            }
        }
        if purged_now {
            self.drop_purged_segments()?;
        }
        if self.segment.len() >= self.segment_bytes {
            let next = self.manifest.last_segment + 1;
            self.segment = Segment::create(&self.dir, next, self.write_cache.clone())?;
            self.enter_segment(next)?;
        }
        Ok(())
    }

    /// Older segments whose entries are all purged go, front first.
    fn drop_purged_segments(&mut self) -> io::Result<()> {
        let Some(upto) = self.purged else {
            return Ok(());
        };
        let current = self.manifest.last_segment;
        let mut first = self.manifest.first_segment;
        while first < current
            && self
                .segment_last_index
                .get(&first)
                .is_none_or(|&last| last <= upto.index())
        {
            first += 1;
        }
        if first != self.manifest.first_segment {
            self.manifest.first_segment = first;
            write_manifest(&self.dir, self.manifest)?;
            self.delete_before(first)?;
        }
        Ok(())
    }

    /// Deletes segments below `first` (already dropped from the manifest).
    fn delete_before(&mut self, first: u64) -> io::Result<()> {
        for seq in list_segments(&self.dir).map_err(io::Error::other)? {
            if seq < first {
                fs::remove_file(segment_path(&self.dir, seq))?;
            }
        }
        self.segment_last_index.retain(|&seq, _| seq >= first);
        Ok(())
    }
}

impl Memory {
    fn log_state(&self) -> LogState<TypeConfig> {
        let last = self
            .entries
            .values()
            .next_back()
            .map(|entry| entry.log_id())
            .or(self.purged);
        LogState {
            last_purged_log_id: self.purged,
            last_log_id: last,
        }
    }
}

/// Drops the entries after `after` (all for `None`).
fn truncate(entries: &mut BTreeMap<u64, EntryOf<TypeConfig>>, after: Option<LogIdOf<TypeConfig>>) {
    let Some(after) = after else {
        entries.clear();
        return;
    };
    // No entry can follow the last possible index.
    if let Some(first_void) = after.index().checked_add(1) {
        entries.split_off(&first_void);
    }
}

/// Lowers what each segment is known to hold to match a truncation after
/// `after`: void entries keep no segment alive.
fn truncate_segments(
    segment_last_index: &mut BTreeMap<u64, u64>,
    after: Option<LogIdOf<TypeConfig>>,
) {
    let Some(after) = after else {
        segment_last_index.clear();
        return;
    };
    for last in segment_last_index.values_mut() {
        *last = (*last).min(after.index());
    }
}

/// Drops the entries up to and including `upto`.
fn purge(entries: &mut BTreeMap<u64, EntryOf<TypeConfig>>, upto: LogIdOf<TypeConfig>) {
    *entries = match upto.index().checked_add(1) {
        Some(first_kept) => entries.split_off(&first_kept),
        None => BTreeMap::new(),
    };
}

fn read_manifest(dir: &Path) -> Result<Option<Manifest>, ServerError> {
    let path = dir.join(MANIFEST);
    let Some(payload) = files::read_checked(&path, MANIFEST_MAGIC)? else {
        return Ok(None);
    };
    postcard::from_bytes(&payload)
        .map(Some)
        .map_err(|e| ServerError::Corrupt {
            path,
            detail: format!("the Raft log manifest does not decode: {e}"),
        })
}

fn write_manifest(dir: &Path, manifest: Manifest) -> io::Result<()> {
    let payload = postcard::to_stdvec(&manifest).map_err(io::Error::other)?;
    files::replace_durably(dir, MANIFEST, &files::checked(MANIFEST_MAGIC, &payload))
}

impl RaftLog {
    /// Bytes of entries appended since the log was opened, as encoded for
    /// the disk.
    pub(crate) fn appended_bytes(&self) -> u64 {
        self.shared.appended.load(Ordering::Relaxed)
    }

    fn memory(&self) -> MutexGuard<'_, Memory> {
        lock(&self.shared.memory)
    }

    fn queue(&self) -> &Queue {
        &self.shared.queue
    }
}

impl RaftLogReader<TypeConfig> for RaftLog {
    /// The entries in `range` that are kept (not purged).
    ///
    /// Cancel safety: safe, read-only, no await.
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> io::Result<Vec<EntryOf<TypeConfig>>> {
        Ok(self
            .memory()
            .entries
            .range(range)
            .map(|(_, e)| e.clone())
            .collect())
    }

    /// The vote saved last.
    ///
    /// Cancel safety: safe, read-only, no await.
    async fn read_vote(&mut self) -> io::Result<Option<VoteOf<TypeConfig>>> {
        Ok(self.memory().vote)
    }
}

impl RaftLogStorage<TypeConfig> for RaftLog {
    type LogReader = Self;

    /// The last purged and last log ids.
    ///
    /// Cancel safety: safe, read-only, no await.
    async fn get_log_state(&mut self) -> io::Result<LogState<TypeConfig>> {
        Ok(self.memory().log_state())
    }

    /// A reader: this log, shared.
    ///
    /// Cancel safety: safe, no await.
    async fn get_log_reader(&mut self) -> Self {
        self.clone()
    }

    /// Saves the vote durably before returning.
    ///
    /// Cancel safety: the vote is queued before the only await; dropped,
    /// the call still has it written, unwaited.
    async fn save_vote(&mut self, vote: &VoteOf<TypeConfig>) -> io::Result<()> {
        self.memory().vote = Some(*vote);
        self.queue()
            .submit_durably(
                |buffer| buffer.push(&RaftRecord::Vote(*vote)),
                DiskChange::Vote(*vote),
            )
            .await
    }

    /// Records the committed id, without a write of its own.
    ///
    /// Cancel safety: safe, no await. What it queues is durable only with
    /// the next write that waits.
    async fn save_committed(&mut self, committed: Option<LogIdOf<TypeConfig>>) -> io::Result<()> {
        self.memory().committed = committed;
        // Written with the next submission that waits: openraft only uses it
        // to apply sooner after a restart.
        self.queue().submit(
            |buffer| buffer.push(&RaftRecord::Committed(committed)),
            DiskChange::Committed(committed),
            None,
        )
    }

    /// The committed id saved last.
    ///
    /// Cancel safety: safe, read-only, no await.
    async fn read_committed(&mut self) -> io::Result<Option<LogIdOf<TypeConfig>>> {
        Ok(self.memory().committed)
    }

    /// Returns once the entries are readable; `callback` hears when they are
    /// durable (or that they could not be written).
    ///
    /// Cancel safety: safe, no await: the entries are queued and readable
    /// when it returns; `callback` is told once the writer wrote them.
    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> io::Result<()>
    where
        I: IntoIterator<Item = EntryOf<TypeConfig>> + Send,
    {
        let entries: Vec<_> = entries.into_iter().collect();
        let Some(last) = entries.iter().map(|entry| entry.index()).max() else {
            callback.io_completed(Ok(()));
            return Ok(());
        };
        let mut appended = 0;
        self.queue().submit(
            |buffer| {
                let before = buffer.len();
                for entry in &entries {
                    buffer.push(&EntryRecord(entry));
                }
                appended = buffer.len() - before;
            },
            DiskChange::Entries { last },
            Some(Completion::Flushed(callback)),
        )?;
        self.shared
            .appended
            .fetch_add(appended as u64, Ordering::Relaxed);
        let mut memory = self.memory();
        for entry in entries {
            memory.entries.insert(entry.index(), entry);
        }
        Ok(())
    }

    /// Voids the entries after `after`, durably.
    ///
    /// Cancel safety: the truncation is queued before the only await;
    /// dropped, the call still has it written, unwaited.
    async fn truncate_after(&mut self, after: Option<LogIdOf<TypeConfig>>) -> io::Result<()> {
        truncate(&mut self.memory().entries, after);
        self.queue()
            .submit_durably(
                |buffer| buffer.push(&RaftRecord::TruncateAfter(after)),
                DiskChange::Truncate(after),
            )
            .await
    }

    /// Drops the entries up to `upto` (in a snapshot), durably, and the
    /// segments left with none.
    ///
    /// Cancel safety: the purge is queued before the only await; dropped,
    /// the call still has it written, unwaited.
    async fn purge(&mut self, upto: LogIdOf<TypeConfig>) -> io::Result<()> {
        {
            let mut memory = self.memory();
            purge(&mut memory.entries, upto);
            memory.purged = Some(upto);
        }
        self.queue()
            .submit_durably(
                |buffer| buffer.push(&RaftRecord::Purge(upto)),
                DiskChange::Purge(upto),
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use openraft::storage::{IOFlushed, RaftLogStorageExt};
    use openraft::testing::log::{StoreBuilder, Suite};
    use openraft::type_config::alias::LeaderIdOf;
    use openraft::type_config::TypeConfigExt;
    use openraft::vote::RaftLeaderIdExt;
    use openraft::{EntryPayload, StorageError};

    use super::super::segment::{scan, SegmentHeader};
    use super::*;
    use crate::raft::state_machine::CoreMachine;

    struct Builder;

    impl StoreBuilder<TypeConfig, RaftLog, CoreMachine, tempfile::TempDir> for Builder {
        async fn build(
            &self,
        ) -> Result<(tempfile::TempDir, RaftLog, CoreMachine), StorageError<TypeConfig>> {
            let dir = tempfile::tempdir().expect("temporary directory");
            let log = RaftLog::open(dir.path(), 1 << 20).expect("open");
            Ok((dir, log, CoreMachine::for_tests()))
        }
    }

    /// openraft's own test suite for log storage and state machines.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn passes_openraft_storage_suite() {
        Suite::test_all(Builder)
            .await
            .expect("openraft storage suite");
    }

    fn log_id(term: u64, index: u64) -> LogIdOf<TypeConfig> {
        LogIdOf::<TypeConfig>::new(LeaderIdOf::<TypeConfig>::new_committed(term, 1), index)
    }

    fn entry(term: u64, index: u64) -> EntryOf<TypeConfig> {
        EntryOf::<TypeConfig> {
            log_id: log_id(term, index),
            payload: EntryPayload::Blank,
        }
    }

    #[test]
    fn an_entry_record_borrowed_encodes_as_one_owned() {
        let batch = crate::entry::Batch {
            origin: 7,
            seq: 3,
            records: vec![crate::entry::Record::Acks {
                session: locksmith_core::SessionId(9),
                replies: vec![1, 2],
                lost: vec![3],
            }]
            .into(),
        };
        for payload in [EntryPayload::Blank, EntryPayload::Normal(batch)] {
            let entry = EntryOf::<TypeConfig> {
                log_id: log_id(2, 5),
                payload,
            };
            assert_eq!(
                postcard::to_allocvec(&EntryRecord(&entry)).unwrap(),
                postcard::to_allocvec(&RaftRecord::Entry(entry.clone())).unwrap()
            );
        }
    }

    /// Appends and waits until the entries are durable.
    async fn append(log: &mut RaftLog, entries: Vec<EntryOf<TypeConfig>>) {
        log.blocking_append(entries).await.expect("append");
    }

    async fn indexes(log: &mut RaftLog) -> Vec<(u64, u64)> {
        log.try_get_log_entries(..)
            .await
            .unwrap()
            .iter()
            .map(|e| (e.log_id().leader_id.term, e.index()))
            .collect()
    }

    /// A write cache that notes what it is told and holds each sync until
    /// released.
    #[derive(Default)]
    struct HeldSyncs {
        told: Mutex<Vec<&'static str>>,
        release: Arc<tokio::sync::Notify>,
    }

    impl WriteCache for HeldSyncs {
        fn writing(&self, path: &Path, _offset: u64, len: u64) {
            let name = path.file_name().unwrap().to_string_lossy();
            assert!(name.starts_with("log-") && len > 0, "{name}, {len} bytes");
            self.told.lock().unwrap().push("writing");
        }

        fn synced(&self, path: &Path) {
            let name = path.file_name().unwrap().to_string_lossy();
            assert!(name.starts_with("log-"), "{name}");
            self.told.lock().unwrap().push("synced");
        }

        fn sync(&self) -> crate::environment::Syncing {
            let release = self.release.clone();
            Box::pin(async move { release.notified().await })
        }
    }

    /// Through a write cache (a simulated disk's), a commit is written,
    /// then waits for the cache's sync, and only then is synced and
    /// acknowledged: a crash meanwhile finds it written and not synced, and
    /// nobody told it is durable.
    #[tokio::test]
    async fn through_a_write_cache_a_commit_is_acknowledged_after_its_sync() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Arc::new(HeldSyncs::default());
        let mut log =
            RaftLog::open_on(dir.path(), 1 << 20, Execution::Tasks, Some(cache.clone())).unwrap();
        // The new segment's restatements, written and synced at once.
        assert_eq!(*cache.told.lock().unwrap(), ["writing", "synced"]);
        cache.told.lock().unwrap().clear();
        let vote = VoteOf::<TypeConfig>::new_committed(3, 2);
        let mut saving = log.clone();
        let saved = tokio::spawn(async move { saving.save_vote(&vote).await });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!saved.is_finished(), "acknowledged before its sync");
        assert_eq!(*cache.told.lock().unwrap(), ["writing"]);
        cache.release.notify_one();
        saved.await.unwrap().expect("saved");
        assert_eq!(*cache.told.lock().unwrap(), ["writing", "synced"]);
        assert_eq!(log.read_vote().await.unwrap(), Some(vote));
    }

    #[tokio::test]
    async fn everything_survives_a_reopen_across_segments() {
        let dir = tempfile::tempdir().unwrap();
        let vote = VoteOf::<TypeConfig>::new_committed(3, 2);
        {
            // Tiny segments: every append starts a new one.
            let mut log = RaftLog::open(dir.path(), 1).unwrap();
            append(&mut log, (1..=10).map(|i| entry(1, i)).collect()).await;
            log.save_vote(&vote).await.unwrap();
            log.truncate_after(Some(log_id(1, 6))).await.unwrap();
            append(&mut log, (7..=8).map(|i| entry(2, i)).collect()).await;
            log.purge(log_id(1, 3)).await.unwrap();
            log.save_committed(Some(log_id(2, 7))).await.unwrap();
            append(&mut log, vec![entry(2, 9)]).await;
        }
        let mut log = RaftLog::open(dir.path(), 1).unwrap();
        assert_eq!(
            indexes(&mut log).await,
            [(1, 4), (1, 5), (1, 6), (2, 7), (2, 8), (2, 9)]
        );
        assert_eq!(log.read_vote().await.unwrap(), Some(vote));
        assert_eq!(log.read_committed().await.unwrap(), Some(log_id(2, 7)));
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id, Some(log_id(1, 3)));
        assert_eq!(state.last_log_id, Some(log_id(2, 9)));

        // A purge of everything lets every older segment go, and still
        // nothing is lost on the next start.
        log.purge(log_id(2, 9)).await.unwrap();
        drop(log);
        let segments = list_segments(dir.path()).unwrap();
        assert!(segments.len() <= 2, "older segments deleted: {segments:?}");
        let mut log = RaftLog::open(dir.path(), 1).unwrap();
        assert_eq!(indexes(&mut log).await, []);
        assert_eq!(log.read_vote().await.unwrap(), Some(vote));
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id, Some(log_id(2, 9)));
    }

    #[tokio::test]
    async fn appends_are_readable_at_once_and_acknowledged_once_durable() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = RaftLog::open(dir.path(), 1 << 20).unwrap();
        let mut acknowledged = Vec::new();
        for i in 1..=20 {
            let (flushed, durable) = TypeConfig::oneshot();
            log.append(vec![entry(1, i)], IOFlushed::signal(flushed))
                .await
                .unwrap();
            // openraft replicates what it appended before it is durable.
            assert_eq!(indexes(&mut log).await.last(), Some(&(1, i)));
            acknowledged.push(durable);
        }
        for (i, durable) in (1..).zip(acknowledged) {
            durable.await.unwrap().expect("written");
            // Acknowledged: on disk, as a restart would read it.
            let on_disk = RaftLog::read(dir.path(), false).unwrap();
            assert!(on_disk.state.entries.contains_key(&i), "entry {i}");
        }
    }

    #[tokio::test]
    async fn truncating_or_purging_at_the_last_possible_index_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut log = RaftLog::open(dir.path(), 1 << 20).unwrap();
            append(&mut log, vec![entry(1, 1), entry(1, 2)]).await;
            // Nothing follows the last index: both entries stay.
            log.truncate_after(Some(log_id(1, u64::MAX))).await.unwrap();
            assert_eq!(indexes(&mut log).await, [(1, 1), (1, 2)]);
        }
        let mut log = RaftLog::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(indexes(&mut log).await, [(1, 1), (1, 2)]);
        // A purge up to it drops everything.
        log.purge(log_id(1, u64::MAX)).await.unwrap();
        assert_eq!(indexes(&mut log).await, []);
        drop(log);
        let mut log = RaftLog::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(indexes(&mut log).await, []);
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id, Some(log_id(1, u64::MAX)));
    }

    #[test]
    fn a_log_that_leaves_no_next_segment_number_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = Manifest {
            first_segment: 1,
            last_segment: u64::MAX,
        };
        write_manifest(dir.path(), manifest).unwrap();
        for recover in [false, true] {
            let error = RaftLog::read(dir.path(), recover).err().expect("refused");
            assert!(matches!(error, ServerError::Corrupt { .. }), "{error}");
            assert!(
                error.to_string().contains("no segment can follow"),
                "{error}"
            );
        }
    }

    #[tokio::test]
    async fn a_torn_tail_is_cut_and_damage_or_a_missing_segment_refuses() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut log = RaftLog::open(dir.path(), 1 << 20).unwrap();
            append(&mut log, (1..=3).map(|i| entry(1, i)).collect()).await;
            append(&mut log, vec![entry(1, 4)]).await;
        }
        let newest = *list_segments(dir.path()).unwrap().last().unwrap();
        let path = segment_path(dir.path(), newest);
        // Garbage where the next write would have gone: a torn last write.
        let end = {
            let bytes = fs::read(&path).unwrap();
            let header = SegmentHeader::decode(&bytes).unwrap();
            scan(&bytes, header.seed).end_at
        };
        let mut file = fs::OpenOptions::new().write(true).open(&path).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&file, &[7, 0, 0, 0, 1, 2, 3], end as u64)
            .unwrap();
        file.flush().unwrap();
        drop(file);
        let mut log = RaftLog::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(indexes(&mut log).await.len(), 4, "the torn tail is cut");
        drop(log);

        // A flipped bit in the first frame of the segment with the entries,
        // with valid frames after it: damage, refused, the file untouched.
        let with_entries = list_segments(dir.path()).unwrap()[0];
        let path = segment_path(dir.path(), with_entries);
        let mut bytes = fs::read(&path).unwrap();
        let header = SegmentHeader::decode(&bytes).unwrap();
        let frames = scan(&bytes, header.seed)
            .frames
            .iter()
            .map(|f| f.0)
            .collect::<Vec<_>>();
        assert!(frames.len() >= 2, "{frames:?}");
        bytes[frames[0] + 20] ^= 1;
        fs::write(&path, &bytes).unwrap();
        let error = RaftLog::open(dir.path(), 1 << 20).err().expect("refused");
        let message = error.to_string();
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert!(message.contains("valid frame follows"), "{message}");
        assert_eq!(fs::read(&path).unwrap(), bytes, "the evidence is kept");

        // A missing segment is refused too.
        fs::remove_file(&path).unwrap();
        let error = RaftLog::open(dir.path(), 1 << 20).err().expect("refused");
        assert!(matches!(error, ServerError::Missing { .. }), "{error}");
    }
}
