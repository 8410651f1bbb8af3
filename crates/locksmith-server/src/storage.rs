//! The durable store: an append-only command log in segments, plus snapshots
//! that bound it.
//!
//! # Files in the data directory
//!
//! | file | content |
//! |---|---|
//! | `LOCK` | held with `flock(2)` while a server runs, so two servers never share a directory |
//! | `log-<seq>` | log segment number `seq` (20 decimal digits): a sequence of records |
//! | `snapshot` | the whole state as of the start of segment `first_segment` |
//! | `snapshot.tmp` | a snapshot being written (ignored and removed on start) |
//!
//! The directory is created with mode 0700 and every file in it with 0600
//! (the log and snapshots hold the secrets that resume sessions); a start
//! takes away any access other users have to an existing directory and its
//! files, and logs it.
//!
//! A **record** is one [`LogRecord`] (a command with the time it was applied at,
//! see [`crate::core`]) encoded with `postcard`, framed as
//! `[len: u32 LE][crc32: u32 LE][payload]`. A crash (kill -9, power loss) can
//! leave a torn record at the end of the newest segment; recovery detects it by
//! its length or checksum, truncates the segment there and goes on. Everything
//! before it was acknowledged only after an `fdatasync` covering it, so what is
//! cut off was never acknowledged to anyone. A bad record anywhere else means
//! lost committed data, and the server refuses to start.
//!
//! The **snapshot** file is `[magic "LSNP"][format: u32 LE][len: u64 LE]
//! [crc32: u32 LE][payload]`, written to `snapshot.tmp`, fsynced, renamed over
//! `snapshot`, and the directory fsynced: it is either the old or the new one,
//! never half. Its payload records `first_segment`, the first segment whose
//! records come after it; older segments are deleted once the snapshot is
//! durable.
//!
//! **Recovery** = load `snapshot` (if any), replay segments `>= first_segment`
//! in order, then write a fresh snapshot and start a new segment (so every
//! start compacts the log).
//!
//! # Zeros ahead of the end
//!
//! An `fdatasync` after an append must also make the file's new size durable
//! (on ext4 a journal commit); one after overwriting blocks the file already
//! has only flushes the data, which is much cheaper (on the benchmark machine
//! p50 35–43 µs instead of 54–170 µs, and half the CPU). So, like PostgreSQL's
//! pre-allocated WAL segments, a segment keeps at least [`ZEROS_LOW_WATER`]
//! bytes of zeros, written and fsynced, ahead of its last record
//! ([`Storage::prepare`], between batches), and a commit writes its records
//! over them. A record never has length 0, so on recovery a zero length field
//! is the end of a segment's records; in an older segment everything after it
//! must be zeros, in the newest it is at most unacknowledged bytes of a write
//! a crash interrupted.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use locksmith_core::{Command, LostReason, Millis, Snapshot};
use serde::{Deserialize, Serialize};

use crate::error::ServerError;

/// Bytes of a record header: length and CRC-32.
const HEADER: usize = 8;
/// Largest record accepted on recovery (anything larger is garbage).
const MAX_RECORD: usize = 64 << 20;
const SNAPSHOT_MAGIC: &[u8; 4] = b"LSNP";
/// Zeros [`Storage::prepare`] adds ahead of the end of the log at a time:
/// small enough that writing and fsyncing them delays the next batch by well
/// under a millisecond.
const ZEROS_CHUNK: usize = 256 << 10;
/// [`Storage::prepare`] adds a chunk of zeros when fewer than this are left.
const ZEROS_LOW_WATER: u64 = 64 << 10;
/// Version of the snapshot and record encoding. 2: expiries carry the
/// deadline they were decided from, and a `GrantGrace` command exists.
const FORMAT: u32 = 2;

/// One logged state change: an engine command and the time it was applied at,
/// plus what the server needs to rebuild its own session table on replay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LogRecord {
    /// The engine time the command was applied at.
    pub now: Millis,
    /// The command.
    pub command: Command,
    /// For `OpenSession`: the secret a client needs to resume the session.
    pub secret: Option<u128>,
    /// For a release, renew or cancel sent on a session stream: the client's
    /// request id, so that replay rebuilds the reply a retry gets.
    pub request: Option<u64>,
}

/// The borrowed twin of [`LogRecord`], encoded identically, so that a command
/// is logged without cloning it.
#[derive(Serialize)]
pub(crate) struct LogRecordRef<'a> {
    pub now: Millis,
    pub command: &'a Command,
    pub secret: Option<u128>,
    pub request: Option<u64>,
}

/// A final reply kept for a session until its client acknowledges it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Outcome {
    /// Granted with these tokens.
    Granted(Vec<u64>),
    /// A no-wait acquire found the lock busy.
    WouldBlock,
    /// The wait time passed.
    TimedOut,
    /// A release or renew succeeded.
    Done,
    /// The acquire was cancelled.
    Cancelled,
}

/// A lost hold not yet acknowledged by its session's client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LostNotice {
    /// The lock.
    pub name: String,
    /// The owner.
    pub owner: String,
    /// The hold's token.
    pub token: u64,
    /// Why.
    pub reason: LostReason,
}

/// The server's part of a session, kept next to the engine's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SessionRecord {
    /// Session id.
    pub session: u64,
    /// Resume secret.
    pub secret: u128,
    /// Session TTL (told to the client on resume).
    pub ttl: Millis,
    /// Unacknowledged final replies by request id.
    pub replies: Vec<(u64, Outcome)>,
    /// Unacknowledged lost notices.
    pub lost: Vec<LostNotice>,
}

/// Everything the server needs to start again without the log before it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ServerSnapshot {
    /// The first log segment whose records follow this snapshot.
    pub first_segment: u64,
    /// The latest engine time applied so far.
    pub last_now: Millis,
    /// Next session id to hand out.
    pub next_session: u64,
    /// Next request id for sessionless (unary) acquires.
    pub next_unary: u64,
    /// The engine.
    pub engine: Snapshot,
    /// The server's session table.
    pub sessions: Vec<SessionRecord>,
}

/// The open data directory and the log segment being appended to.
#[derive(Debug)]
pub(crate) struct Storage {
    dir: PathBuf,
    /// Held for the `flock` on `LOCK`.
    _lock: File,
    /// The segment being appended to (`None` until recovery wrote its snapshot).
    segment: Option<Segment>,
    segment_seq: u64,
    /// Segments to replay, found by [`Storage::open`].
    to_replay: Vec<u64>,
}

/// Encoded records not yet handed to [`Storage::commit`].
#[derive(Debug, Default)]
pub(crate) struct LogBuffer {
    bytes: Vec<u8>,
    records: u64,
}

/// Where a record being appended starts, to finish or roll it back.
pub(crate) struct Mark(usize);

impl LogBuffer {
    /// Appends a record; [`LogBuffer::finish`] or [`LogBuffer::rollback`] it
    /// once the command's outcome is known.
    pub(crate) fn begin(&mut self, record: &LogRecordRef<'_>) -> Mark {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(&[0; HEADER]);
        self.bytes = postcard::to_extend(record, std::mem::take(&mut self.bytes))
            .expect("log records always encode");
        Mark(start)
    }

    /// Seals the record begun at `mark` with its length and checksum.
    pub(crate) fn finish(&mut self, mark: Mark) {
        let payload = &self.bytes[mark.0 + HEADER..];
        let len = payload.len() as u32;
        let crc = crc32fast::hash(payload);
        self.bytes[mark.0..mark.0 + 4].copy_from_slice(&len.to_le_bytes());
        self.bytes[mark.0 + 4..mark.0 + HEADER].copy_from_slice(&crc.to_le_bytes());
        self.records += 1;
    }

    /// Drops the record begun at `mark` (the command failed or changed nothing).
    pub(crate) fn rollback(&mut self, mark: Mark) {
        self.bytes.truncate(mark.0);
    }

    /// Bytes of sealed records.
    pub(crate) fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Takes the records: their bytes and how many they are.
    pub(crate) fn take(&mut self) -> (Vec<u8>, u64) {
        let records = std::mem::take(&mut self.records);
        (std::mem::take(&mut self.bytes), records)
    }

    /// Gives the bytes [`LogBuffer::take`] took back once they are written, to
    /// reuse their allocation.
    pub(crate) fn give_back(&mut self, mut bytes: Vec<u8>) {
        if self.bytes.is_empty() {
            bytes.clear();
            self.bytes = bytes;
        }
    }
}

/// The log segment being appended to.
#[derive(Debug)]
struct Segment {
    file: File,
    /// End of its records: where the next commit writes.
    end: u64,
    /// End of the zeros ahead of `end` (the file's length).
    zeroed: u64,
}

impl Segment {
    /// Creates segment `path`, durable with its directory entry and a first
    /// chunk of zeros.
    fn create(dir: &Path, path: &Path) -> io::Result<Segment> {
        let mut segment = Segment {
            file: create_durable(dir, path)?,
            end: 0,
            zeroed: 0,
        };
        segment.add_zeros()?;
        Ok(segment)
    }

    /// Writes a chunk of zeros after the current ones and makes it durable
    /// (this fsync pays for the file's new size, so commits do not).
    fn add_zeros(&mut self) -> io::Result<()> {
        static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
        let mut at = self.zeroed;
        for _ in 0..ZEROS_CHUNK / ZEROS.len() {
            self.file.write_all_at(&ZEROS, at)?;
            at += ZEROS.len() as u64;
        }
        self.file.sync_data()?;
        self.zeroed = at;
        Ok(())
    }
}

impl Storage {
    /// Opens (creating if needed) and locks the data directory, and loads the
    /// snapshot. Call [`Storage::replay`] next.
    pub(crate) fn open(dir: &Path) -> Result<(Storage, Option<ServerSnapshot>), ServerError> {
        make_owner_only(dir)?;
        let lock = lock_dir(dir)?;
        let _ = fs::remove_file(dir.join("snapshot.tmp"));
        let snapshot = read_snapshot(&dir.join("snapshot"))?;
        let first = snapshot.as_ref().map_or(0, |s| s.first_segment);
        let mut segments = list_segments(dir)?;
        for &old in segments.iter().filter(|&&seq| seq < first) {
            let _ = fs::remove_file(segment_path(dir, old));
        }
        segments.retain(|&seq| seq >= first);
        let last = segments.last().copied().unwrap_or(first);
        Ok((
            Storage {
                dir: dir.to_owned(),
                _lock: lock,
                // Recovery ends with a snapshot, which starts a new segment.
                segment: None,
                segment_seq: last,
                to_replay: segments,
            },
            snapshot,
        ))
    }

    /// Feeds every logged record after the snapshot to `apply`, in order, and
    /// truncates a torn tail of the newest segment. Returns the record count.
    pub(crate) fn replay(&mut self, mut apply: impl FnMut(LogRecord)) -> Result<u64, ServerError> {
        let segments = std::mem::take(&mut self.to_replay);
        let mut count = 0;
        for (i, &seq) in segments.iter().enumerate() {
            let newest = i + 1 == segments.len();
            let path = segment_path(&self.dir, seq);
            let mut bytes = Vec::new();
            File::open(&path)
                .and_then(|mut f| f.read_to_end(&mut bytes))
                .map_err(|e| io_error(format!("cannot read {}", path.display()), e))?;
            let mut at = 0;
            let mut torn = false;
            while let Some(frame) = next_frame(&bytes[at..]) {
                let record: LogRecord = match frame {
                    Ok(payload) => {
                        postcard::from_bytes(payload).map_err(|e| ServerError::Corrupt {
                            path: path.clone(),
                            detail: format!("record at byte {at} does not decode: {e}"),
                        })?
                    }
                    Err(detail) if newest => {
                        tracing::warn!(
                            segment = %path.display(), offset = at, %detail,
                            "torn record at the end of the log (a crash during a write): truncating"
                        );
                        truncate(&path, at as u64)?;
                        torn = true;
                        break;
                    }
                    Err(detail) => {
                        return Err(ServerError::Corrupt {
                            path,
                            detail: format!("bad record at byte {at}: {detail}"),
                        })
                    }
                };
                at += HEADER + frame_len(&bytes[at..]);
                apply(record);
                count += 1;
            }
            let rest = bytes.get(at..).unwrap_or_default();
            if !torn && rest.iter().any(|&b| b != 0) {
                if !newest {
                    return Err(ServerError::Corrupt {
                        path,
                        detail: format!("data after the end of the records at byte {at}"),
                    });
                }
                tracing::warn!(
                    segment = %path.display(), offset = at,
                    "unacknowledged bytes after the end of the log (a crash during a write): ignored"
                );
            }
        }
        Ok(count)
    }

    /// Writes `records` (over the zeros ahead of the end) and makes them
    /// durable with one `fdatasync`: the group commit.
    pub(crate) fn commit(&mut self, records: &[u8]) -> io::Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        let segment = self
            .segment
            .as_mut()
            .ok_or_else(|| io::Error::other("no log segment open"))?;
        segment.file.write_all_at(records, segment.end)?;
        segment.end += records.len() as u64;
        segment.zeroed = segment.zeroed.max(segment.end);
        segment.file.sync_data()
    }

    /// Keeps at least [`ZEROS_LOW_WATER`] bytes of zeros ahead of the end of
    /// the log, so that commits overwrite blocks instead of growing the file.
    /// Call it between batches: when it adds zeros, it writes and fsyncs a
    /// chunk of 256 KiB (every couple of thousand records).
    pub(crate) fn prepare(&mut self) -> io::Result<()> {
        match self.segment.as_mut() {
            Some(segment) if segment.zeroed - segment.end < ZEROS_LOW_WATER => segment.add_zeros(),
            _ => Ok(()),
        }
    }

    /// Writes `snapshot` (which must reflect every record committed so far,
    /// and no other), starts a new segment after it and deletes the segments
    /// it replaces.
    pub(crate) fn write_snapshot(&mut self, snapshot: &mut ServerSnapshot) -> io::Result<()> {
        let next = self.segment_seq + 1;
        let segment = Segment::create(&self.dir, &segment_path(&self.dir, next))?;
        snapshot.first_segment = next;
        let payload = postcard::to_stdvec(snapshot).map_err(io::Error::other)?;
        let mut bytes = Vec::with_capacity(payload.len() + 20);
        bytes.extend_from_slice(SNAPSHOT_MAGIC);
        bytes.extend_from_slice(&FORMAT.to_le_bytes());
        bytes.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        bytes.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        bytes.extend_from_slice(&payload);
        let tmp = self.dir.join("snapshot.tmp");
        let mut file = owner_only()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        drop(file);
        fs::rename(&tmp, self.dir.join("snapshot"))?;
        sync_dir(&self.dir)?;
        for old in list_segments(&self.dir).map_err(io::Error::other)? {
            if old < next {
                fs::remove_file(segment_path(&self.dir, old))?;
            }
        }
        self.segment = Some(segment);
        self.segment_seq = next;
        Ok(())
    }
}

fn frame_len(bytes: &[u8]) -> usize {
    u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes")) as usize
}

/// The next record's payload, `None` at a clean end (the end of the file or
/// a zero length field: the zeros ahead of the end), `Err` for a torn or
/// corrupt record.
fn next_frame(bytes: &[u8]) -> Option<Result<&[u8], String>> {
    if bytes.is_empty() || bytes.iter().take(4).all(|&b| b == 0) {
        return None;
    }
    if bytes.len() < HEADER {
        return Some(Err(format!("{} bytes of a record header", bytes.len())));
    }
    let len = frame_len(bytes);
    let crc = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
    if len > MAX_RECORD {
        return Some(Err(format!("record length {len}")));
    }
    let Some(payload) = bytes.get(HEADER..HEADER + len) else {
        return Some(Err(format!(
            "record of {len} bytes, only {} present",
            bytes.len() - HEADER
        )));
    };
    if crc32fast::hash(payload) != crc {
        return Some(Err("checksum mismatch".into()));
    }
    Some(Ok(payload))
}

fn read_snapshot(path: &Path) -> Result<Option<ServerSnapshot>, ServerError> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error(format!("cannot read {}", path.display()), e)),
    };
    let corrupt = |detail: String| ServerError::Corrupt {
        path: path.to_owned(),
        detail,
    };
    if bytes.len() < 20 || &bytes[0..4] != SNAPSHOT_MAGIC {
        return Err(corrupt("not a locksmith snapshot".into()));
    }
    let format = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
    if format != FORMAT {
        return Err(corrupt(format!(
            "snapshot format {format}, this server reads {FORMAT}"
        )));
    }
    let len = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes")) as usize;
    let crc = u32::from_le_bytes(bytes[16..20].try_into().expect("4 bytes"));
    let payload = bytes
        .get(20..20 + len)
        .ok_or_else(|| corrupt(format!("snapshot of {len} bytes is cut short")))?;
    if crc32fast::hash(payload) != crc {
        return Err(corrupt("snapshot checksum mismatch".into()));
    }
    postcard::from_bytes(payload)
        .map(Some)
        .map_err(|e| corrupt(format!("snapshot does not decode: {e}")))
}

fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("log-{seq:020}"))
}

fn list_segments(dir: &Path) -> Result<Vec<u64>, ServerError> {
    let entries =
        fs::read_dir(dir).map_err(|e| io_error(format!("cannot list {}", dir.display()), e))?;
    let mut segments: Vec<u64> = entries
        .filter_map(|entry| {
            let name = entry.ok()?.file_name();
            name.to_str()?.strip_prefix("log-")?.parse().ok()
        })
        .collect();
    segments.sort_unstable();
    Ok(segments)
}

/// Creates an empty file and makes both it and its directory entry durable.
fn create_durable(dir: &Path, path: &Path) -> io::Result<File> {
    let file = owner_only()
        .create(true)
        .truncate(true)
        .write(true)
        .open(path)?;
    file.sync_all()?;
    sync_dir(dir)?;
    Ok(file)
}

/// Options that create a file readable and writable by its owner only (mode
/// 0600, before the umask): the log and snapshots hold session secrets.
fn owner_only() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.mode(0o600);
    options
}

/// Creates `dir` (mode 0700) if needed, and takes away any access other users
/// have to an existing one and to the files in it (an earlier release made
/// them 0755 and 0644).
fn make_owner_only(dir: &Path) -> Result<(), ServerError> {
    let context = |what: &str, path: &Path| format!("cannot {what} {}", path.display());
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| io_error(context("create", dir), e))?;
    let restrict = |path: &Path, mode: u32| -> Result<Option<u32>, ServerError> {
        let old = fs::metadata(path)
            .map_err(|e| io_error(context("inspect", path), e))?
            .permissions()
            .mode();
        if old & 0o077 == 0 {
            return Ok(None);
        }
        fs::set_permissions(path, fs::Permissions::from_mode(mode))
            .map_err(|e| io_error(context("restrict the mode of", path), e))?;
        Ok(Some(old & 0o777))
    };
    if let Some(old) = restrict(dir, 0o700)? {
        tracing::warn!(
            data_dir = %dir.display(), old_mode = format!("{old:o}"),
            "the data directory was open to other users: made owner-only (700)"
        );
    }
    let entries = fs::read_dir(dir).map_err(|e| io_error(context("list", dir), e))?;
    for entry in entries {
        let path = entry.map_err(|e| io_error(context("list", dir), e))?.path();
        if path.is_file() {
            if let Some(old) = restrict(&path, 0o600)? {
                tracing::warn!(
                    file = %path.display(), old_mode = format!("{old:o}"),
                    "a data file was open to other users: made owner-only (600)"
                );
            }
        }
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn truncate(path: &Path, len: u64) -> Result<(), ServerError> {
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| io_error(format!("cannot open {}", path.display()), e))?;
    file.set_len(len)
        .and_then(|()| file.sync_all())
        .map_err(|e| io_error(format!("cannot truncate {}", path.display()), e))
}

/// Takes an exclusive `flock` on `dir/LOCK`, failing if another server holds it.
fn lock_dir(dir: &Path) -> Result<File, ServerError> {
    let path = dir.join("LOCK");
    let file = owner_only()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| io_error(format!("cannot open {}", path.display()), e))?;
    // SAFETY: flock(2) on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let error = io::Error::last_os_error();
        return Err(if error.kind() == io::ErrorKind::WouldBlock {
            ServerError::DataDirInUse(dir.to_owned())
        } else {
            io_error(format!("cannot lock {}", path.display()), error)
        });
    }
    Ok(file)
}

fn io_error(context: String, source: io::Error) -> ServerError {
    ServerError::Io { context, source }
}

#[cfg(test)]
mod tests {
    use super::*;
    use locksmith_core::SessionId;

    fn record(n: u64) -> LogRecord {
        LogRecord {
            now: n,
            command: Command::Heartbeat {
                session: SessionId(n),
            },
            secret: (n % 2 == 0).then_some(u128::from(n) << 64),
            request: Some(n),
        }
    }

    fn append(buffer: &mut LogBuffer, r: &LogRecord) {
        let mark = buffer.begin(&LogRecordRef {
            now: r.now,
            command: &r.command,
            secret: r.secret,
            request: r.request,
        });
        buffer.finish(mark);
    }

    fn commit(storage: &mut Storage, buffer: &mut LogBuffer) {
        storage.commit(&buffer.take().0).unwrap();
    }

    fn empty_snapshot() -> ServerSnapshot {
        ServerSnapshot {
            first_segment: 0,
            last_now: 0,
            next_session: 1,
            next_unary: 1,
            engine: Snapshot::default(),
            sessions: Vec::new(),
        }
    }

    fn reopen(dir: &Path) -> (Storage, Option<ServerSnapshot>, Vec<LogRecord>) {
        let (mut storage, snapshot) = Storage::open(dir).unwrap();
        let mut records = Vec::new();
        storage.replay(|r| records.push(r)).unwrap();
        (storage, snapshot, records)
    }

    #[test]
    fn records_survive_and_a_torn_tail_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let end = {
            let (mut storage, _, records) = reopen(dir.path());
            let mut buffer = LogBuffer::default();
            assert!(records.is_empty());
            storage.write_snapshot(&mut empty_snapshot()).unwrap();
            for n in 0..10 {
                append(&mut buffer, &record(n));
            }
            let mark = buffer.begin(&LogRecordRef {
                now: 99,
                command: &record(99).command,
                secret: None,
                request: None,
            });
            buffer.rollback(mark);
            commit(&mut storage, &mut buffer);
            storage.segment.as_ref().unwrap().end
        };
        // Tear the last record: cut the segment 3 bytes before its end.
        let segment = list_segments(dir.path()).unwrap()[0];
        let path = segment_path(dir.path(), segment);
        OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(end - 3)
            .unwrap();

        let (storage, snapshot, records) = reopen(dir.path());
        drop(storage);
        assert!(snapshot.is_some());
        assert_eq!(records, (0..9).map(record).collect::<Vec<_>>());
        // The torn bytes are gone: a second recovery sees the same and no warning.
        let (_storage, _, again) = reopen(dir.path());
        assert_eq!(again.len(), 9);
    }

    #[test]
    fn snapshot_replaces_older_segments() {
        let dir = tempfile::tempdir().unwrap();
        let (mut storage, _, _) = reopen(dir.path());
        let mut buffer = LogBuffer::default();
        storage.write_snapshot(&mut empty_snapshot()).unwrap();
        append(&mut buffer, &record(1));
        commit(&mut storage, &mut buffer);
        let mut snapshot = empty_snapshot();
        snapshot.next_session = 42;
        storage.write_snapshot(&mut snapshot).unwrap();
        append(&mut buffer, &record(2));
        commit(&mut storage, &mut buffer);
        drop(storage);

        assert_eq!(list_segments(dir.path()).unwrap().len(), 1);
        let (_storage, snapshot, records) = reopen(dir.path());
        assert_eq!(snapshot.unwrap().next_session, 42);
        assert_eq!(records, [record(2)]);
    }

    #[test]
    fn corruption_before_the_end_refuses_to_start() {
        let dir = tempfile::tempdir().unwrap();
        let (mut storage, _, _) = reopen(dir.path());
        let mut buffer = LogBuffer::default();
        storage.write_snapshot(&mut empty_snapshot()).unwrap();
        for n in 0..3 {
            append(&mut buffer, &record(n));
        }
        commit(&mut storage, &mut buffer);
        let first = storage.segment_seq;
        // A second segment after the first, without a snapshot (as after a crash
        // during a snapshot write).
        storage.segment =
            Some(Segment::create(dir.path(), &segment_path(dir.path(), first + 1)).unwrap());
        storage.segment_seq = first + 1;
        append(&mut buffer, &record(7));
        commit(&mut storage, &mut buffer);
        drop(storage);
        let path = segment_path(dir.path(), first);
        let mut bytes = fs::read(&path).unwrap();
        bytes[HEADER + 1] ^= 0xff;
        fs::write(&path, bytes).unwrap();

        let (mut storage, _) = Storage::open(dir.path()).unwrap();
        assert!(matches!(
            storage.replay(|_| {}),
            Err(ServerError::Corrupt { .. })
        ));
    }

    #[test]
    fn records_are_written_over_zeros_ahead_of_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let (mut storage, _, _) = reopen(dir.path());
        let mut buffer = LogBuffer::default();
        storage.write_snapshot(&mut empty_snapshot()).unwrap();
        let first = storage.segment_seq;
        let path = segment_path(dir.path(), first);
        assert_eq!(fs::metadata(&path).unwrap().len(), ZEROS_CHUNK as u64);
        // Enough records to use up most of the first chunk of zeros.
        let mut n = 0;
        while buffer.len() < ZEROS_CHUNK - ZEROS_LOW_WATER as usize / 2 {
            append(&mut buffer, &record(n));
            n += 1;
        }
        commit(&mut storage, &mut buffer);
        let end = storage.segment.as_ref().unwrap().end;
        assert_eq!(fs::metadata(&path).unwrap().len(), ZEROS_CHUNK as u64);
        storage.prepare().unwrap();
        assert_eq!(fs::metadata(&path).unwrap().len(), 2 * ZEROS_CHUNK as u64);
        let bytes = fs::read(&path).unwrap();
        assert!(bytes[end as usize..].iter().all(|&b| b == 0));
        // A second segment without a snapshot (a crash during a snapshot
        // write): the first one's zeros are its clean end.
        storage.segment =
            Some(Segment::create(dir.path(), &segment_path(dir.path(), first + 1)).unwrap());
        storage.segment_seq = first + 1;
        append(&mut buffer, &record(n));
        commit(&mut storage, &mut buffer);
        drop(storage);
        let (storage, _, records) = reopen(dir.path());
        drop(storage);
        assert_eq!(records, (0..=n).map(record).collect::<Vec<_>>());

        // Data after the end of an older segment's records is corruption.
        let mut bytes = fs::read(&path).unwrap();
        bytes[end as usize + 100] = 1;
        fs::write(&path, &bytes).unwrap();
        let (mut storage, _) = Storage::open(dir.path()).unwrap();
        assert!(matches!(
            storage.replay(|_| {}),
            Err(ServerError::Corrupt { .. })
        ));
    }

    #[test]
    fn one_server_per_directory() {
        let dir = tempfile::tempdir().unwrap();
        let _first = Storage::open(dir.path()).unwrap();
        assert!(matches!(
            Storage::open(dir.path()),
            Err(ServerError::DataDirInUse(_))
        ));
    }
}
