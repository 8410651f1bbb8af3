//! The durable store: an append-only command log in segments, snapshots that
//! bound it, and a manifest that says what the directory must hold.
//!
//! # Files in the data directory
//!
//! | file | content |
//! |---|---|
//! | `LOCK` | held with `flock(2)` while a server runs, so two servers never share a directory |
//! | `MANIFEST` | which snapshot and segments the directory holds, and the fencing token ceiling |
//! | `snapshot` | the whole state as of the start of segment `first_segment` |
//! | `log-<seq>` | log segment number `seq` (20 decimal digits): a header, then frames of records |
//! | `*.tmp` | a `MANIFEST` or `snapshot` being written (removed on start) |
//! | `damaged-<time>/` | hard links to the files as a forced recovery found them |
//!
//! The directory is created with mode 0700 and every file in it with 0600
//! (the log and snapshots hold the secrets that resume sessions); a start
//! takes away any access other users have to an existing directory and its
//! files, and logs it.
//!
//! **`MANIFEST`** and **`snapshot`** are *checked files*: `[magic][format: u32]
//! [len: u64][crc32: u32][payload]` (little-endian; magic `LSMF` and `LSNP`),
//! replaced atomically (written to `<name>.tmp`, fsynced, renamed over
//! `<name>`, directory fsynced). The manifest's payload is a [`Manifest`]: the
//! snapshot exists (or not), the log after it is in segments `first_segment
//! ..= last_segment` (none if `last < first`), and `token_ceiling`. The
//! snapshot's payload is a [`ServerSnapshot`], which names `first_segment`,
//! the segment it precedes.
//!
//! A **segment** starts with a 24-byte header `["LSEG"][format: u32][seq:
//! u64][seed: u32][crc32 of the 20 bytes before]`, then **frames**, then
//! zeros (see below). A frame is `[len: u32][crc32 of payload: u32][crc32 of
//! the 8 bytes before: u32][payload]`, both checksums started from the
//! segment's random `seed`; the payload is [`LogRecord`]s encoded with
//! `postcard`, back to back. One commit writes one frame and makes it durable
//! with one `fdatasync` (a commit above 1 MiB writes several, each durable
//! before the next is written), so **a crash can only tear the last frame**.
//!
//! # Writing
//!
//! - A commit writes its frame at the end of the newest segment and
//!   `fdatasync`s it; replies go out after that.
//! - `token_ceiling`: no token above it was ever made visible. When a commit
//!   (or a snapshot) carries a token above it, the manifest is rewritten with
//!   the ceiling [`TOKEN_RESERVATION`] higher before the commit returns, so
//!   before any reply carries the token: a manifest write per million tokens.
//! - A segment that reaches [`crate::ServerConfig::segment_bytes`] is closed
//!   after the commit that filled it: segment `last + 1` is created (header
//!   and zeros, fsynced, directory fsynced), the manifest names it, and only
//!   then does it receive frames.
//! - A snapshot starts a new segment `next` (created first), is written
//!   atomically with `first_segment = next`, then the manifest becomes
//!   `next ..= next`, then older segments are deleted.
//!
//! # Recovery
//!
//! On start, in this order; anything that does not check out stops the
//! server with a [`ServerError`] naming the file (and byte offset) and leaves
//! the files as they are:
//!
//! 1. No `MANIFEST`: a directory without snapshot whose segments hold only
//!    zeros is new (it gets a manifest before anything else); a directory
//!    written by the release before manifests existed is migrated if its log
//!    holds no records (it was stopped gracefully, the snapshot holds
//!    everything), else refused with what to do; any other directory lost its
//!    manifest, is damaged, and is refused (even under
//!    `recover_damaged_data`: it no longer knows its token ceiling).
//! 2. The snapshot must exist if the manifest says so, check out, and precede
//!    `first_segment` (or a segment after `last_segment`: a crash came
//!    between a snapshot and its manifest; a snapshot is written after every
//!    segment the manifest names, so it covers them all).
//! 3. Every named segment must exist, with a header naming its own number.
//! 4. Segments outside the named range are leftovers of interrupted writes:
//!    older ones (covered by the snapshot) are deleted, newer ones must hold
//!    no frames (else damage) and are deleted.
//! 5. Each named segment is read frame by frame. Where the valid frames end,
//!    the rest of an older segment must be zeros. In the newest, what follows
//!    may be the last write, torn by a crash (never acknowledged): zeros, a
//!    frame cut short or with a wrong checksum, bytes after zeros. It is cut
//!    **unless a valid frame follows** anywhere after it: a crash cannot put
//!    one there, so that is damage (a flipped bit, a wrong length, a zeroed
//!    block) before acknowledged data, and the server refuses. A valid frame
//!    whose records do not decode is damage too.
//!
//! Then the state is rebuilt (snapshot + replay), a fresh snapshot written
//! and a new segment started: every start compacts the log.
//!
//! **Forced recovery** (`recover_damaged_data`): at the first damage found,
//! every file is hard-linked into `damaged-<time>/` (the evidence, untouched),
//! and recovery keeps what comes before the damage: the snapshot and the
//! segments and frames before it (nothing at all if the snapshot is missing
//! or damaged, since the log after it means nothing without it). What was
//! lost may have handed out fencing tokens up to the ceiling, so the token
//! counter starts at `token_ceiling` ([`Storage::token_floor`]): no token is
//! ever handed out twice.
//!
//! # Zeros ahead of the end
//!
//! An `fdatasync` after an append must also make the file's new size durable
//! (on ext4 a journal commit); one after overwriting blocks the file already
//! has only flushes the data, which is much cheaper (on the benchmark machine
//! p50 35–43 µs instead of 54–170 µs, and half the CPU). So, like PostgreSQL's
//! pre-allocated WAL segments, a segment keeps at least 64 KiB of zeros,
//! written and fsynced, ahead of its last frame ([`Storage::prepare`],
//! between batches), and a commit writes its frame over them. A frame's
//! length is never 0, so a zero length field is where a segment's frames end.

mod files;
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) mod raft_log;
mod segment;

use std::fs::{self, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use locksmith_core::{Command, LostReason, Millis, SessionId, Snapshot};
use serde::{Deserialize, Serialize};

use self::files::{io_error, list_segments, segment_path};
pub(crate) use self::segment::LogBuffer;
use self::segment::{
    scan, End, Segment, SegmentHeader, SegmentRecord, SEGMENT_HEADER, SEGMENT_MAGIC,
};
use crate::config::ServerConfig;
use crate::error::ServerError;

const SNAPSHOT_MAGIC: &[u8; 4] = b"LSNP";
const MANIFEST_MAGIC: &[u8; 4] = b"LSMF";
/// How far above the last token issued the manifest's token ceiling is set
/// when a token passes it: large, so that the manifest is rarely rewritten.
pub(crate) const TOKEN_RESERVATION: u64 = 1_000_000;
/// Said with every refusal that a forced recovery can get past.
const RECOVERY_HINT: &str = "nothing was changed; restore the data directory from a backup, or \
     start with --recover-damaged-data (ServerConfig::recover_damaged_data) to keep what comes before \
     the damage (see docs/RELIABILITY.md)";

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

/// One logged record: what a client (or the clock) asked of the server, in
/// the order the server decided it. Applying the records in order rebuilds
/// the engine and the session table exactly, on replay as when they were
/// first applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Record {
    /// An engine command, with what the server keeps beside it.
    Command(LogRecord),
    /// A session's client acknowledged these replies (request ids) and lost
    /// notices (tokens): they are no longer kept, and the ids are free again.
    Acks {
        session: SessionId,
        replies: Vec<u64>,
        lost: Vec<u64>,
    },
}

impl SegmentRecord for Record {
    fn decode_frame(format: u32, payload: &[u8]) -> Result<Vec<Record>, postcard::Error> {
        if format == 1 {
            let commands: Vec<LogRecord> = segment::decode_records(payload)?;
            return Ok(commands.into_iter().map(Record::Command).collect());
        }
        segment::decode_records(payload)
    }
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

/// Said when the manifest is missing or damaged.
const MANIFEST_HINT: &str = "without it the server cannot tell which files the directory must \
     hold or which fencing tokens it handed out, so it does not start, not even with \
     --recover-damaged-data; restore MANIFEST from a backup of this directory (or, if every \
     fenced resource can forget the tokens it has seen, move the directory away and start with \
     an empty one)";

/// What the data directory must hold: the payload of `MANIFEST`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Manifest {
    /// Whether `snapshot` exists; it holds the state before `first_segment`.
    pub snapshot: bool,
    /// The first segment of the log after the snapshot.
    pub first_segment: u64,
    /// The newest segment (below `first_segment` when there is none).
    pub last_segment: u64,
    /// No fencing token above it was ever made visible.
    pub token_ceiling: u64,
}

impl Manifest {
    fn read(dir: &Path) -> Result<Option<Manifest>, ServerError> {
        let path = dir.join("MANIFEST");
        let payload = files::read_checked(&path, MANIFEST_MAGIC).map_err(|error| match error {
            ServerError::Corrupt { path, detail } => ServerError::Corrupt {
                path,
                detail: format!("{detail}; {MANIFEST_HINT}"),
            },
            error => error,
        })?;
        let Some(payload) = payload else {
            return Ok(None);
        };
        postcard::from_bytes(&payload)
            .map(Some)
            .map_err(|e| ServerError::Corrupt {
                path,
                detail: format!("the manifest does not decode: {e}; {MANIFEST_HINT}"),
            })
    }

    fn write(&self, dir: &Path) -> io::Result<()> {
        let payload = postcard::to_stdvec(self).map_err(io::Error::other)?;
        files::replace_durably(dir, "MANIFEST", &files::checked(MANIFEST_MAGIC, &payload))
    }

    /// The ceiling once tokens up to `last_token` may be visible.
    fn ceiling_for(&self, last_token: u64) -> u64 {
        if last_token > self.token_ceiling {
            last_token + TOKEN_RESERVATION
        } else {
            self.token_ceiling
        }
    }
}

/// The open data directory and the log segment being appended to.
#[derive(Debug)]
pub(crate) struct Storage {
    dir: PathBuf,
    /// Held for the `flock` on `LOCK`.
    _lock: std::fs::File,
    /// What `MANIFEST` says.
    manifest: Manifest,
    /// The segment being appended to (`None` until recovery wrote its snapshot).
    segment: Option<Segment>,
    /// The highest segment number in the directory: new segments go above it.
    segment_seq: u64,
    /// Segments to replay, found by [`Storage::open`].
    to_replay: Vec<u64>,
    /// A segment this long is closed after the commit that filled it.
    segment_bytes: u64,
    /// Recover what is intact instead of refusing to start on damage.
    recover_damaged: bool,
    /// Set once a forced recovery left damaged data out.
    token_floor: Option<u64>,
    /// Where a forced recovery keeps the files as it found them.
    evidence: Option<PathBuf>,
}

impl Storage {
    /// Opens (creating if needed) and locks the data directory, checks it
    /// against its manifest and loads the snapshot. Call [`Storage::replay`]
    /// next.
    pub(crate) fn open(
        dir: &Path,
        config: &ServerConfig,
    ) -> Result<(Storage, Option<ServerSnapshot>), ServerError> {
        files::make_owner_only(dir)?;
        let lock = files::lock_dir(dir)?;
        for tmp in ["MANIFEST.tmp", "snapshot.tmp"] {
            let _ = fs::remove_file(dir.join(tmp));
        }
        let present = list_segments(dir)?;
        let manifest = match Manifest::read(dir)? {
            Some(manifest) => manifest,
            None => first_manifest(dir, &present)?,
        };
        let mut storage = Storage {
            dir: dir.to_owned(),
            _lock: lock,
            segment_seq: present
                .last()
                .copied()
                .unwrap_or(0)
                .max(manifest.last_segment),
            manifest,
            segment: None,
            to_replay: Vec::new(),
            segment_bytes: config.segment_bytes.max(1),
            recover_damaged: config.recover_damaged_data,
            token_floor: None,
            evidence: None,
        };
        let snapshot = storage.check(&present)?;
        Ok((storage, snapshot))
    }

    /// Checks the snapshot and the segments against the manifest (steps 2–4
    /// of the module docs), lists the segments to replay and removes
    /// leftovers of interrupted writes.
    fn check(&mut self, present: &[u64]) -> Result<Option<ServerSnapshot>, ServerError> {
        let Manifest {
            snapshot: has_snapshot,
            first_segment: first,
            last_segment: last,
            ..
        } = self.manifest;
        let path = self.dir.join("snapshot");
        let snapshot = match read_snapshot(&path) {
            Ok(snapshot) => snapshot,
            Err(error) if is_damage(&error) => return self.damaged(error).map(|()| None),
            Err(error) => return Err(error),
        };
        let (first, last) = match &snapshot {
            // A crash between a snapshot and its manifest: a snapshot is
            // always written after every segment the manifest names, so it
            // covers them all.
            Some(s) if s.first_segment > last => (s.first_segment, s.first_segment - 1),
            Some(s) if has_snapshot && s.first_segment == first => (first, last),
            Some(s) => {
                let expected = if has_snapshot {
                    format!("MANIFEST says the snapshot precedes segment {first}")
                } else {
                    "MANIFEST says there is no snapshot yet".into()
                };
                let detail = format!(
                    "the snapshot precedes segment {}, but {expected}: it is not the snapshot \
                     this directory committed",
                    s.first_segment
                );
                return self.damaged(corrupt(path, detail)).map(|()| None);
            }
            None if has_snapshot => {
                let detail = format!("MANIFEST says it holds the state before segment {first}");
                let missing = ServerError::Missing { path, detail };
                return self.damaged(missing).map(|()| None);
            }
            None => (first, last),
        };
        for seq in first..=last {
            if present.binary_search(&seq).is_err() {
                let detail = format!(
                    "MANIFEST says the log after the snapshot is in segments {first} to {last}"
                );
                let path = segment_path(&self.dir, seq);
                self.damaged(ServerError::Missing { path, detail })?;
                break;
            }
            self.to_replay.push(seq);
        }
        let mut leftovers = Vec::new();
        for &seq in present.iter().filter(|seq| !(first..=last).contains(seq)) {
            let path = segment_path(&self.dir, seq);
            if seq > last && !holds_nothing(&path)? {
                let detail = format!(
                    "MANIFEST names segments {first} to {last} only, yet this one holds data \
                     after its header"
                );
                self.damaged(corrupt(path, detail))?;
            } else {
                leftovers.push(path);
            }
        }
        for path in leftovers {
            tracing::info!(
                segment = %path.display(),
                "removing a segment left over by an interrupted snapshot or segment change"
            );
            fs::remove_file(&path).map_err(|e| io_error("cannot remove", &path, e))?;
        }
        Ok(snapshot)
    }

    /// Damage was found: refuses to start with `error`, or, under
    /// `recover_damaged_data`, keeps the files as they are in
    /// `damaged-<time>/`, makes tokens restart at the ceiling, and lets
    /// recovery go on with what comes before the damage.
    fn damaged(&mut self, error: ServerError) -> Result<(), ServerError> {
        if !self.recover_damaged {
            return Err(match error {
                ServerError::Corrupt { path, detail } => ServerError::Corrupt {
                    path,
                    detail: format!("{detail}; {RECOVERY_HINT}"),
                },
                ServerError::Missing { path, detail } => ServerError::Missing {
                    path,
                    detail: format!("{detail}; {RECOVERY_HINT}"),
                },
                error => error,
            });
        }
        if self.evidence.is_none() {
            let evidence = files::keep_evidence(&self.dir)?;
            tracing::warn!(
                evidence = %evidence.display(),
                "the data directory is damaged: its files as found are kept"
            );
            self.evidence = Some(evidence);
        }
        let ceiling = self.manifest.token_ceiling;
        tracing::error!(
            %error, token_floor = ceiling,
            "recovering what comes before the damage (recover_damaged_data); what comes after \
             it is lost, and fencing tokens restart above every token handed out before"
        );
        self.token_floor = Some(ceiling);
        Ok(())
    }

    /// Feeds every logged record after the snapshot to `apply`, in order
    /// (step 5 of the module docs), and cuts a torn tail of the newest
    /// segment. Returns the record count.
    pub(crate) fn replay(&mut self, mut apply: impl FnMut(Record)) -> Result<u64, ServerError> {
        let segments = std::mem::take(&mut self.to_replay);
        let mut count = 0;
        for (i, &seq) in segments.iter().enumerate() {
            let newest = i + 1 == segments.len();
            match self.replay_segment(seq, newest, &mut apply, &mut count) {
                Err(error) if is_damage(&error) => {
                    self.damaged(error)?;
                    break;
                }
                result => result?,
            }
        }
        Ok(count)
    }

    fn replay_segment(
        &self,
        seq: u64,
        newest: bool,
        apply: &mut impl FnMut(Record),
        count: &mut u64,
    ) -> Result<(), ServerError> {
        replay_segment(&self.dir, seq, newest, |record| {
            apply(record);
            *count += 1;
        })
    }

    /// After a forced recovery that left damaged data out: the token ceiling,
    /// which every token from now on must be above.
    pub(crate) fn token_floor(&self) -> Option<u64> {
        self.token_floor
    }

    /// Seals `frames` (from [`LogBuffer::take`]), writes them over the zeros
    /// ahead of the end and makes them durable: the group commit. Raises the
    /// token ceiling first if `last_token`, the engine's, passed it.
    pub(crate) fn commit(&mut self, frames: &mut [u8], last_token: u64) -> io::Result<()> {
        if !frames.is_empty() {
            self.segment
                .as_mut()
                .ok_or_else(|| io::Error::other("no log segment open"))?
                .commit(frames)?;
        }
        let ceiling = self.manifest.ceiling_for(last_token);
        if ceiling != self.manifest.token_ceiling {
            self.set_manifest(Manifest {
                token_ceiling: ceiling,
                ..self.manifest.clone()
            })?;
        }
        Ok(())
    }

    /// Call it between batches: keeps zeros ahead of the end of the log (a
    /// chunk of 256 KiB, written and fsynced, every couple of thousand
    /// records), or closes a full segment and starts the next.
    pub(crate) fn prepare(&mut self) -> io::Result<()> {
        match self.segment.as_mut() {
            Some(segment) if segment.len() >= self.segment_bytes => self.start_segment(),
            Some(segment) => segment.keep_zeros_ahead(),
            None => Ok(()),
        }
    }

    /// Creates the next segment, names it in the manifest, and appends there
    /// from now on.
    fn start_segment(&mut self) -> io::Result<()> {
        let next = self.segment_seq + 1;
        let segment = Segment::create(&self.dir, next)?;
        self.set_manifest(Manifest {
            last_segment: next,
            ..self.manifest.clone()
        })?;
        self.segment = Some(segment);
        self.segment_seq = next;
        Ok(())
    }

    /// Writes `snapshot` (which must reflect every record committed so far,
    /// and no other), starts a new segment after it and deletes the segments
    /// it replaces.
    pub(crate) fn write_snapshot(&mut self, snapshot: &mut ServerSnapshot) -> io::Result<()> {
        let next = self.segment_seq + 1;
        let segment = Segment::create(&self.dir, next)?;
        snapshot.first_segment = next;
        let payload = postcard::to_stdvec(snapshot).map_err(io::Error::other)?;
        files::replace_durably(
            &self.dir,
            "snapshot",
            &files::checked(SNAPSHOT_MAGIC, &payload),
        )?;
        self.set_manifest(Manifest {
            snapshot: true,
            first_segment: next,
            last_segment: next,
            token_ceiling: self.manifest.ceiling_for(snapshot.engine.last_token),
        })?;
        for old in list_segments(&self.dir).map_err(io::Error::other)? {
            if old < next {
                fs::remove_file(segment_path(&self.dir, old))?;
            }
        }
        self.segment = Some(segment);
        self.segment_seq = next;
        Ok(())
    }

    fn set_manifest(&mut self, manifest: Manifest) -> io::Result<()> {
        manifest.write(&self.dir)?;
        self.manifest = manifest;
        Ok(())
    }
}

/// The manifest of a directory that has none (step 1 of the module docs),
/// written before anything else happens in it.
fn first_manifest(dir: &Path, present: &[u64]) -> Result<Manifest, ServerError> {
    let mut earlier_records = None;
    for &seq in present {
        let path = segment_path(dir, seq);
        let bytes = fs::read(&path).map_err(|e| io_error("cannot read", &path, e))?;
        if bytes.starts_with(SEGMENT_MAGIC) {
            let detail = format!(
                "the directory holds log segments ({} among them) but no MANIFEST; \
                 {MANIFEST_HINT}",
                path.display()
            );
            let path = dir.join("MANIFEST");
            return Err(ServerError::Missing { path, detail });
        }
        if earlier_records.is_none() && bytes.iter().any(|&b| b != 0) {
            earlier_records = Some(path);
        }
    }
    let snapshot = read_snapshot(&dir.join("snapshot"))?;
    if let Some(path) = earlier_records {
        let detail = "written by an earlier locksmith release (the directory has no MANIFEST), \
             and its log holds records this release does not read: start the earlier release \
             on the directory once and stop it with SIGTERM (its final snapshot then holds \
             everything), then start this release on it"
            .into();
        return Err(ServerError::Incompatible { path, detail });
    }
    let manifest = match snapshot {
        None => {
            tracing::info!(data_dir = %dir.display(), "a new data directory");
            Manifest {
                snapshot: false,
                first_segment: 1,
                last_segment: 0,
                token_ceiling: 0,
            }
        }
        Some(_) if present.is_empty() => {
            let detail = format!(
                "the directory holds a snapshot but neither MANIFEST nor log segments; \
                 {MANIFEST_HINT}"
            );
            let path = dir.join("MANIFEST");
            return Err(ServerError::Missing { path, detail });
        }
        Some(snapshot) => {
            tracing::warn!(
                data_dir = %dir.display(),
                "taking over a data directory of an earlier release (no MANIFEST): its log is \
                 empty, its snapshot holds everything"
            );
            Manifest {
                snapshot: true,
                first_segment: snapshot.first_segment,
                last_segment: snapshot.first_segment.saturating_sub(1),
                token_ceiling: snapshot.engine.last_token,
            }
        }
    };
    let path = dir.join("MANIFEST");
    manifest
        .write(dir)
        .map_err(|e| io_error("cannot write", &path, e))?;
    Ok(manifest)
}

fn read_snapshot(path: &Path) -> Result<Option<ServerSnapshot>, ServerError> {
    let Some(payload) = files::read_checked(path, SNAPSHOT_MAGIC)? else {
        return Ok(None);
    };
    postcard::from_bytes(&payload).map(Some).map_err(|e| {
        let detail = format!("the snapshot does not decode: {e}");
        corrupt(path.to_owned(), detail)
    })
}

/// Reads segment `seq` of `dir` frame by frame (step 5 of the module docs),
/// handing each record to `apply` in order: cuts a torn tail of the newest
/// segment, and refuses anything else that does not check out with the file
/// and the byte offset, leaving the file as it is.
pub(super) fn replay_segment<R: SegmentRecord>(
    dir: &Path,
    seq: u64,
    newest: bool,
    mut apply: impl FnMut(R),
) -> Result<(), ServerError> {
    let path = segment_path(dir, seq);
    let bytes = fs::read(&path).map_err(|e| io_error("cannot read", &path, e))?;
    let header = SegmentHeader::decode(&bytes).map_err(|detail| corrupt(path.clone(), detail))?;
    if header.seq != seq {
        let detail = format!("its header says it is segment {} (byte 8)", header.seq);
        return Err(corrupt(path, detail));
    }
    let scan = scan(&bytes, header.seed);
    for &(at, payload) in &scan.frames {
        let records = R::decode_frame(header.format, payload).map_err(|e| {
            let detail = format!(
                "the frame at byte {at} passes its checksums, but its records do not decode: {e}"
            );
            corrupt(path.clone(), detail)
        })?;
        records.into_iter().for_each(&mut apply);
    }
    let at = scan.end_at;
    match scan.end {
        End::Clean => Ok(()),
        End::Torn { detail } if newest => {
            tracing::warn!(
                segment = %path.display(), offset = at, %detail,
                "an incomplete last write (a crash during a commit, never acknowledged): cut"
            );
            truncate(&path, at as u64)
        }
        End::Torn { detail } => Err(corrupt(
            path,
            format!(
                "{detail} at byte {at}; in a segment that is not the newest, the frames are \
                 followed by zeros only"
            ),
        )),
        End::Damaged { detail, valid_at } => Err(corrupt(
            path,
            format!(
                "{detail} at byte {at}, and a valid frame follows at byte {valid_at}: the \
                 log was damaged after it was written (a crash can only tear the last write)"
            ),
        )),
    }
}

/// Whether a segment holds nothing but zeros after its header.
fn holds_nothing(path: &Path) -> Result<bool, ServerError> {
    let bytes = fs::read(path).map_err(|e| io_error("cannot read", path, e))?;
    Ok(bytes[SEGMENT_HEADER.min(bytes.len())..]
        .iter()
        .all(|&b| b == 0))
}

/// Whether `error` is about data that cannot be trusted (rather than, say, a
/// file that cannot be read).
fn is_damage(error: &ServerError) -> bool {
    matches!(
        error,
        ServerError::Corrupt { .. } | ServerError::Missing { .. }
    )
}

fn corrupt(path: PathBuf, detail: String) -> ServerError {
    ServerError::Corrupt { path, detail }
}

fn truncate(path: &Path, len: u64) -> Result<(), ServerError> {
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| io_error("cannot open", path, e))?;
    file.set_len(len)
        .and_then(|()| file.sync_all())
        .map_err(|e| io_error("cannot truncate", path, e))
}

#[cfg(test)]
mod tests {
    use super::segment::{FRAME_HEADER, ZEROS_CHUNK, ZEROS_LOW_WATER};
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
        buffer.push(&Record::Command(r.clone()));
    }

    /// Commits `records`, one frame each, as a server does with one record
    /// per batch; `prepare` between them, as the core does.
    fn log(storage: &mut Storage, records: impl IntoIterator<Item = u64>, last_token: u64) {
        let mut buffer = LogBuffer::default();
        for n in records {
            append(&mut buffer, &record(n));
            storage.commit(&mut buffer.take().0, last_token).unwrap();
            storage.prepare().unwrap();
        }
    }

    fn snapshot(last_token: u64) -> ServerSnapshot {
        let engine = Snapshot {
            last_token,
            ..Snapshot::default()
        };
        ServerSnapshot {
            first_segment: 0,
            last_now: 0,
            next_session: 1,
            next_unary: 1,
            engine,
            sessions: Vec::new(),
        }
    }

    fn config(dir: &Path) -> ServerConfig {
        ServerConfig::durable(dir)
    }

    fn forced(dir: &Path) -> ServerConfig {
        ServerConfig {
            recover_damaged_data: true,
            ..ServerConfig::durable(dir)
        }
    }

    fn recover(
        config: &ServerConfig,
    ) -> Result<(Storage, Option<ServerSnapshot>, Vec<LogRecord>), ServerError> {
        let dir = config.data_dir.as_deref().unwrap();
        let (mut storage, snapshot) = Storage::open(dir, config)?;
        let mut records = Vec::new();
        storage.replay(|r| match r {
            Record::Command(r) => records.push(r),
            other => panic!("only commands are logged here: {other:?}"),
        })?;
        Ok((storage, snapshot, records))
    }

    /// Recovers like the core does: open, replay, snapshot.
    fn start(config: &ServerConfig) -> Storage {
        let (mut storage, _, _) = recover(config).unwrap();
        storage.write_snapshot(&mut snapshot(0)).unwrap();
        storage
    }

    fn newest_segment(dir: &Path) -> PathBuf {
        segment_path(dir, *list_segments(dir).unwrap().last().unwrap())
    }

    /// Where the frames of a segment start.
    fn frame_starts(path: &Path) -> Vec<usize> {
        let bytes = fs::read(path).unwrap();
        let mut starts = Vec::new();
        let mut at = SEGMENT_HEADER;
        while bytes[at..at + 4] != [0; 4] {
            starts.push(at);
            at += FRAME_HEADER + u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        }
        starts
    }

    /// Every file in `dir` with its bytes.
    fn contents(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
        let mut files: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file())
            .map(|p| (p.clone(), fs::read(&p).unwrap()))
            .collect();
        files.sort();
        files
    }

    fn manifest(dir: &Path) -> Manifest {
        Manifest::read(dir).unwrap().unwrap()
    }

    #[test]
    fn records_survive_and_a_torn_tail_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path());
        let mut storage = start(&config);
        log(&mut storage, 0..10, 0);
        let end = storage.segment.as_ref().unwrap().len();
        drop(storage);
        // Tear the last frame: the file ends 3 bytes before its end.
        let path = newest_segment(dir.path());
        let last = *frame_starts(&path).last().unwrap();
        OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(end - 3)
            .unwrap();

        let (storage, snapshot, records) = recover(&config).unwrap();
        drop(storage);
        assert!(snapshot.is_some());
        assert_eq!(records, (0..9).map(record).collect::<Vec<_>>());
        assert_eq!(fs::metadata(&path).unwrap().len(), last as u64);
        // The torn bytes are gone: a second recovery sees the same.
        let (_storage, _, again) = recover(&config).unwrap();
        assert_eq!(again.len(), 9);
    }

    #[test]
    fn snapshot_replaces_older_segments() {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path());
        let mut storage = start(&config);
        log(&mut storage, [1], 0);
        let mut second = snapshot(0);
        second.next_session = 42;
        storage.write_snapshot(&mut second).unwrap();
        log(&mut storage, [2], 0);
        drop(storage);

        assert_eq!(list_segments(dir.path()).unwrap().len(), 1);
        let (_storage, snapshot, records) = recover(&config).unwrap();
        assert_eq!(snapshot.unwrap().next_session, 42);
        assert_eq!(records, [record(2)]);
    }

    #[test]
    fn a_damaged_frame_before_valid_ones_refuses_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path());
        let mut storage = start(&config);
        log(&mut storage, 0..5, 0);
        drop(storage);
        let path = newest_segment(dir.path());
        let second = frame_starts(&path)[1];
        let mut bytes = fs::read(&path).unwrap();
        bytes[second + FRAME_HEADER + 2] ^= 0x10;
        fs::write(&path, bytes).unwrap();
        let before = contents(dir.path());

        let error = recover(&config).unwrap_err();
        let message = error.to_string();
        assert!(matches!(error, ServerError::Corrupt { path: ref p, .. } if *p == path));
        assert!(
            message.contains(&format!("at byte {second}, and a valid frame follows")),
            "{message}"
        );
        assert!(message.contains("--recover-damaged-data"), "{message}");
        assert_eq!(contents(dir.path()), before);
    }

    #[test]
    fn damage_after_the_frames_of_an_older_segment_refuses() {
        let dir = tempfile::tempdir().unwrap();
        let config = ServerConfig {
            segment_bytes: 200,
            ..config(dir.path())
        };
        let mut storage = start(&config);
        log(&mut storage, 0..20, 0);
        drop(storage);
        let segments = list_segments(dir.path()).unwrap();
        assert!(segments.len() >= 3, "{segments:?}");
        assert_eq!(manifest(dir.path()).last_segment, *segments.last().unwrap());
        let (storage, _, records) = recover(&config).unwrap();
        drop(storage);
        assert_eq!(records, (0..20).map(record).collect::<Vec<_>>());

        // Garbage after the last frame: torn in the newest segment, damage in
        // an older one (its writes all completed before the next began).
        let mut storage = start(&config);
        log(&mut storage, 0..20, 0);
        drop(storage);
        let older = segment_path(dir.path(), list_segments(dir.path()).unwrap()[0]);
        let end = fs::metadata(&older).unwrap().len() - ZEROS_CHUNK as u64;
        let file = OpenOptions::new().write(true).open(&older).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&file, b"junk", end + 100).unwrap();
        let error = recover(&config).unwrap_err();
        assert!(
            matches!(error, ServerError::Corrupt { ref path, .. } if *path == older),
            "{error}"
        );
    }

    #[test]
    fn missing_pieces_are_refused() {
        for victim in ["snapshot", "newest segment", "middle segment", "MANIFEST"] {
            let dir = tempfile::tempdir().unwrap();
            let config = ServerConfig {
                segment_bytes: 200,
                ..config(dir.path())
            };
            let mut storage = start(&config);
            log(&mut storage, 0..20, 0);
            drop(storage);
            let segments = list_segments(dir.path()).unwrap();
            let path = match victim {
                "snapshot" => dir.path().join("snapshot"),
                "newest segment" => segment_path(dir.path(), segments[segments.len() - 1]),
                "middle segment" => segment_path(dir.path(), segments[1]),
                _ => dir.path().join("MANIFEST"),
            };
            fs::remove_file(&path).unwrap();
            let before = contents(dir.path());
            let error = recover(&config).unwrap_err();
            assert!(
                matches!(error, ServerError::Missing { path: ref p, .. } if *p == path),
                "{victim}: {error}"
            );
            assert_eq!(contents(dir.path()), before, "{victim}");
        }
    }

    #[test]
    fn forced_recovery_keeps_the_evidence_and_restarts_tokens_at_the_ceiling() {
        let dir = tempfile::tempdir().unwrap();
        let mut storage = start(&config(dir.path()));
        log(&mut storage, 0..5, 500);
        drop(storage);
        assert_eq!(manifest(dir.path()).token_ceiling, 500 + TOKEN_RESERVATION);
        let newest = newest_segment(dir.path());
        let bytes = fs::read(&newest).unwrap();
        let third = frame_starts(&newest)[2];
        let mut damaged = bytes.clone();
        damaged[third..third + 4].copy_from_slice(&7u32.to_le_bytes());
        fs::write(&newest, &damaged).unwrap();

        let (mut storage, recovered, records) = recover(&forced(dir.path())).unwrap();
        assert!(recovered.is_some());
        assert_eq!(records, [record(0), record(1)]);
        assert_eq!(storage.token_floor(), Some(500 + TOKEN_RESERVATION));
        let evidence = storage.evidence.clone().unwrap();
        let kept = evidence.join(newest.file_name().unwrap());
        assert_eq!(fs::read(&kept).unwrap(), damaged);
        assert!(evidence.join("MANIFEST").exists() && evidence.join("snapshot").exists());
        // The recovery's snapshot replaces the damaged segment; the evidence stays.
        storage.write_snapshot(&mut snapshot(0)).unwrap();
        assert!(!newest.exists());
        assert_eq!(fs::read(&kept).unwrap(), damaged);
        drop(storage);
        let (storage, _, _) = recover(&config(dir.path())).unwrap();
        assert_eq!(storage.token_floor(), None);
    }

    #[test]
    fn forced_recovery_without_a_snapshot_keeps_nothing_of_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let mut storage = start(&config(dir.path()));
        log(&mut storage, 0..5, 9);
        drop(storage);
        fs::remove_file(dir.path().join("snapshot")).unwrap();
        let (storage, snapshot, records) = recover(&forced(dir.path())).unwrap();
        assert!(snapshot.is_none());
        assert!(records.is_empty());
        assert_eq!(storage.token_floor(), Some(9 + TOKEN_RESERVATION));
    }

    #[test]
    fn the_token_ceiling_is_durable_before_a_commit_returns() {
        let dir = tempfile::tempdir().unwrap();
        let mut storage = start(&config(dir.path()));
        assert_eq!(manifest(dir.path()).token_ceiling, 0);
        log(&mut storage, [1], 5);
        assert_eq!(manifest(dir.path()).token_ceiling, 5 + TOKEN_RESERVATION);
        log(&mut storage, [2], 5 + TOKEN_RESERVATION);
        assert_eq!(manifest(dir.path()).token_ceiling, 5 + TOKEN_RESERVATION);
        log(&mut storage, [3], 6 + TOKEN_RESERVATION);
        assert_eq!(
            manifest(dir.path()).token_ceiling,
            6 + 2 * TOKEN_RESERVATION
        );
        // A snapshot carrying higher tokens (replayed ones) raises it too.
        storage
            .write_snapshot(&mut snapshot(7 + 2 * TOKEN_RESERVATION))
            .unwrap();
        assert_eq!(
            manifest(dir.path()).token_ceiling,
            7 + 3 * TOKEN_RESERVATION
        );
    }

    #[test]
    fn a_crash_between_a_snapshot_and_its_manifest_is_recovered() {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path());
        let mut storage = start(&config);
        log(&mut storage, 0..3, 0);
        // A segment change was interrupted (an empty segment is left over),
        // then the recovery's snapshot was written above it (its new segment
        // first), but not the manifest.
        let leftover = storage.segment_seq + 1;
        Segment::create(dir.path(), leftover).unwrap();
        let next = leftover + 1;
        Segment::create(dir.path(), next).unwrap();
        let mut newer = snapshot(0);
        newer.first_segment = next;
        newer.next_session = 5;
        let payload = postcard::to_stdvec(&newer).unwrap();
        files::replace_durably(
            dir.path(),
            "snapshot",
            &files::checked(SNAPSHOT_MAGIC, &payload),
        )
        .unwrap();
        drop(storage);
        let (_storage, snapshot, records) = recover(&config).unwrap();
        assert_eq!(snapshot.unwrap().next_session, 5);
        assert!(records.is_empty());
        assert_eq!(list_segments(dir.path()).unwrap(), [] as [u64; 0]);
    }

    #[test]
    fn segments_the_manifest_does_not_name_must_be_empty() {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path());
        let mut storage = start(&config);
        log(&mut storage, 0..3, 0);
        let next = storage.segment_seq + 1;
        drop(storage);
        // An interrupted change of segment: the new one is empty, removed.
        Segment::create(dir.path(), next).unwrap();
        let (storage, _, records) = recover(&config).unwrap();
        drop(storage);
        assert_eq!(records.len(), 3);
        assert!(!segment_path(dir.path(), next).exists());
        // One that holds frames is no leftover.
        let mut segment = Segment::create(dir.path(), next).unwrap();
        let mut buffer = LogBuffer::default();
        append(&mut buffer, &record(9));
        segment.commit(&mut buffer.take().0).unwrap();
        let error = recover(&config).unwrap_err();
        assert!(
            matches!(error, ServerError::Corrupt { ref path, .. } if *path == segment_path(dir.path(), next)),
            "{error}"
        );
    }

    #[test]
    fn a_new_directory_gets_its_manifest_first() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let (_storage, snapshot, records) = recover(&config(&data)).unwrap();
        assert!(snapshot.is_none() && records.is_empty());
        assert!(!manifest(&data).snapshot);
    }

    #[test]
    fn a_directory_of_the_release_before_manifests() {
        // A graceful stop of that release left a snapshot and an empty segment.
        let dir = tempfile::tempdir().unwrap();
        let mut old = snapshot(40);
        old.first_segment = 3;
        old.next_session = 8;
        let payload = postcard::to_stdvec(&old).unwrap();
        fs::write(
            dir.path().join("snapshot"),
            files::checked(SNAPSHOT_MAGIC, &payload),
        )
        .unwrap();
        let segment = segment_path(dir.path(), 3);
        fs::write(&segment, vec![0; ZEROS_CHUNK]).unwrap();
        let (mut storage, snapshot, records) = recover(&config(dir.path())).unwrap();
        assert_eq!(snapshot.unwrap().next_session, 8);
        assert!(records.is_empty());
        assert_eq!(manifest(dir.path()).token_ceiling, 40);
        storage.write_snapshot(&mut old).unwrap();
        drop(storage);
        assert_eq!(
            recover(&config(dir.path()))
                .unwrap()
                .1
                .unwrap()
                .first_segment,
            4
        );

        // Stopped by a crash: its log holds records in the old format.
        let dir = tempfile::tempdir().unwrap();
        fs::write(
            dir.path().join("snapshot"),
            files::checked(SNAPSHOT_MAGIC, &payload),
        )
        .unwrap();
        fs::write(segment_path(dir.path(), 3), [9, 0, 0, 0, 1, 2, 3, 4, 5]).unwrap();
        let error = recover(&config(dir.path())).unwrap_err();
        assert!(matches!(error, ServerError::Incompatible { .. }), "{error}");
        assert!(error.to_string().contains("SIGTERM"), "{error}");
        assert!(!dir.path().join("MANIFEST").exists());
    }

    #[test]
    fn records_are_written_over_zeros_ahead_of_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let mut storage = start(&config(dir.path()));
        let path = newest_segment(dir.path());
        let created = (SEGMENT_HEADER + ZEROS_CHUNK) as u64;
        assert_eq!(fs::metadata(&path).unwrap().len(), created);
        // Enough records to use up most of the first chunk of zeros.
        let mut buffer = LogBuffer::default();
        let mut n = 0;
        while buffer.len() < ZEROS_CHUNK - ZEROS_LOW_WATER as usize / 2 {
            append(&mut buffer, &record(n));
            n += 1;
        }
        storage.commit(&mut buffer.take().0, 0).unwrap();
        let end = storage.segment.as_ref().unwrap().len();
        assert_eq!(fs::metadata(&path).unwrap().len(), created);
        storage.prepare().unwrap();
        assert_eq!(
            fs::metadata(&path).unwrap().len(),
            created + ZEROS_CHUNK as u64
        );
        let bytes = fs::read(&path).unwrap();
        assert!(bytes[end as usize..].iter().all(|&b| b == 0));
        drop(storage);
        let (_storage, _, records) = recover(&config(dir.path())).unwrap();
        assert_eq!(records, (0..n).map(record).collect::<Vec<_>>());
    }

    #[test]
    fn one_server_per_directory() {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path());
        let _first = Storage::open(dir.path(), &config).unwrap();
        assert!(matches!(
            Storage::open(dir.path(), &config),
            Err(ServerError::DataDirInUse(_))
        ));
    }
}
