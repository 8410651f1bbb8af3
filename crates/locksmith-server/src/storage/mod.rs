//! What the server keeps on disk: the records of its log, the segments they
//! are written in, and the data directory of a Raft member.
//!
//! - `segment.rs`: the log's file format, shared by every log: a segment is
//!   a 24-byte header `["LSEG"][format: u32][seq: u64][seed: u32][crc32 of
//!   the 20 bytes before]`, then **frames**, then zeros. A frame is `[len:
//!   u32][crc32 of payload: u32][crc32 of the 8 bytes before: u32][payload]`,
//!   both checksums started from the segment's random `seed`; the payload is
//!   records encoded with `postcard`, back to back. One append writes one
//!   frame (several above 1 MiB, each durable before the next) and makes it
//!   durable with one `fdatasync`, so **a crash can only tear the last
//!   frame**.
//! - [`replay_segment`] reads a segment back: where the valid frames end, the
//!   rest of an older segment must be zeros; in the newest, what follows may
//!   be the last write, torn by a crash (never acknowledged), and is cut
//!   **unless a valid frame follows** anywhere after it: a crash cannot put
//!   one there, so that is damage (a flipped bit, a wrong length, a zeroed
//!   block) before acknowledged data, refused with the file and the byte
//!   offset. A segment of a newer format, or a valid frame whose records do
//!   not decode (a record kind of a newer version), is refused as written
//!   by a newer version: never damage that a forced recovery drops.
//! - `raft_log.rs`: openraft's log storage over segments.
//! - `snapshot.rs`: the layout of a snapshot's data (the engine and the
//!   server's session table), and the older layout it still reads; the
//!   applied state a core freezes for one (`FrozenState`).
//! - `member.rs`: a member's data directory (the Raft log, the snapshot, the
//!   token ceiling) and what a start checks; docs/RELIABILITY.md says what
//!   an operator sees.
//! - `backup.rs`: backups of the replicated state (`locksmith snapshot`),
//!   and the data directories of a new cluster restored from one (a backup
//!   of a stopped member's directory is replayed by the core:
//!   `core::member_data`).
//! - `background.rs`: encoding a frozen state on a thread of lower
//!   priority, so that serving wins the CPU.
//! - `files.rs`: checked files replaced atomically, owner-only modes, the
//!   directory lock, evidence of damage, and the locked temporary directory
//!   of a server without a data directory.
//!
//! # Zeros ahead of the end
//!
//! An `fdatasync` after an append must also make the file's new size durable
//! (on ext4 a journal commit); one after overwriting blocks the file already
//! has only flushes the data, which is much cheaper (on the benchmark machine
//! p50 35–43 µs instead of 54–170 µs, and half the CPU). So, like PostgreSQL's
//! pre-allocated WAL segments, a segment keeps at least 64 KiB of zeros,
//! written and fsynced, ahead of its last frame, and an append writes its
//! frame over them. A frame's length is never 0, so a zero length field is
//! where a segment's frames end.

pub(crate) mod background;
pub mod backup;
pub(crate) mod files;
pub(crate) mod member;
pub(crate) mod raft_log;
mod segment;
mod snapshot;

use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};

use locksmith_core::{LostReason, Millis};
use serde::{Deserialize, Serialize};

use self::files::{io_error, segment_path};
use self::segment::{scan, End, HeaderError, SegmentHeader, SegmentRecord, SEGMENT_FORMAT};
use crate::entry::{LogRecord, Record};
use crate::error::ServerError;
pub(crate) use snapshot::{FrozenState, ServerSnapshot};

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
    let header = SegmentHeader::decode(&bytes).map_err(|problem| match problem {
        HeaderError::Damaged(detail) => corrupt(path.clone(), detail),
        HeaderError::Newer(format) => newer(
            path.clone(),
            format!(
                "segment format {format}, written by a newer version: this one reads formats \
                 up to {SEGMENT_FORMAT}"
            ),
        ),
    })?;
    if header.seq != seq {
        let detail = format!("its header says it is segment {} (byte 8)", header.seq);
        return Err(corrupt(path, detail));
    }
    let scan = scan(&bytes, header.seed);
    for &(at, payload) in &scan.frames {
        let records = R::decode_frame(header.format, payload).map_err(|e| {
            let detail = format!(
                "the frame at byte {at} passes its checksums, but its records do not decode \
                 ({e}): a newer version wrote kinds of records this one does not know"
            );
            newer(path.clone(), detail)
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

fn corrupt(path: PathBuf, detail: String) -> ServerError {
    ServerError::Corrupt { path, detail }
}

/// Written by a newer version: refused whatever the start allows, the files
/// left as they are.
fn newer(path: PathBuf, detail: String) -> ServerError {
    ServerError::Incompatible {
        path,
        detail: format!("{detail}; nothing was changed: start the newer version"),
    }
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
