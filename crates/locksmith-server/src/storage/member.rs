//! The data directory of a member of a Raft group (every server is one).
//!
//! # Files
//!
//! | file | content |
//! |---|---|
//! | `LOCK` | held with `flock(2)` while a server runs, so two servers never share a directory |
//! | `raft/` | the Raft log ([`RaftLog`]: `RAFTLOG` names its segments `log-<seq>`) |
//! | `snapshot` | the newest snapshot: openraft's metadata (last applied log id, membership) and the engine's state |
//! | `TOKENS` | the fencing token ceiling: no token above it was ever made visible |
//! | `RESTORING` | present while `locksmith snapshot restore` makes the directory |
//! | `*.tmp` | a `snapshot` or `TOKENS` being written (removed on start) |
//!
//! The directory is 0700 and every file in it 0600 (the log and snapshots
//! hold the secrets that resume sessions); a start takes away any access
//! other users have, and logs it.
//!
//! `snapshot` and `TOKENS` are checked files (magic `LSSN` / `LSTK`, format,
//! length, crc32; see `files.rs`), replaced atomically and durably.
//!
//! # What a start checks
//!
//! Anything that does not check out stops the start with an error naming the
//! file, and the files stay as they are:
//!
//! - the Raft log against its own manifest (`raft_log.rs`: a torn last frame
//!   is cut; damage before valid frames and missing segments are refused);
//! - a log purged up to entry X (its entries are in a snapshot) needs a
//!   snapshot whose last log id is at least X: a missing or older snapshot is
//!   refused, since the state up to X exists nowhere else on this member;
//! - a log that holds entries needs `TOKENS`, and `TOKENS` above 0 needs a
//!   log: a member started afresh beside it would hand out its tokens again;
//! - a restore that did not finish (`RESTORING`) is refused, since the
//!   directory lacks part of the backup's state;
//! - a directory in the single server's layout of an earlier development
//!   version (`MANIFEST`, no `raft/`) is refused: no release wrote it.
//!
//! A member whose directory is damaged is replaced, not repaired: wipe it and
//! add the machine back as a new learner under a new node id; its peers send
//! it everything.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::type_config::alias::{LogIdOf, SnapshotMetaOf};
use serde::{Deserialize, Serialize};

use super::files::{self, io_error};
use super::raft_log::RaftLog;
use crate::config::ServerConfig;
use crate::entry::TypeConfig;
use crate::environment::WriteCache;
use crate::error::ServerError;

const SNAPSHOT_MAGIC: &[u8; 4] = b"LSSN";
const TOKENS_MAGIC: &[u8; 4] = b"LSTK";
/// How far the ceiling is raised past the newest token at a time: one
/// `TOKENS` write per million tokens.
const TOKEN_RESERVATION: u64 = 1_000_000;
/// The highest token ceiling or restore floor a member accepts, 2^63: the
/// tokens above it last millions of years at any rate, so a higher one
/// is damage or a mistake, refused before the token arithmetic could
/// overflow.
pub(crate) const TOKEN_LIMIT: u64 = 1 << 63;
/// The file a restore writes first and removes last (`backup.rs`).
pub(crate) const RESTORING: &str = "RESTORING";

/// A snapshot as a member keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct StoredSnapshot {
    /// openraft's metadata: the last log id it covers and the membership.
    pub meta: SnapshotMetaOf<TypeConfig>,
    /// The core's state (`ServerSnapshot`, postcard).
    pub data: Vec<u8>,
}

impl StoredSnapshot {
    /// Reads the layout [`stored_file`] writes (serde's, as
    /// `postcard::from_bytes` reads it) from a file's `payload`, keeping its
    /// buffer for the data: serde would copy tens of megabytes into a new
    /// vector a byte at a time, growing it as it goes.
    pub(crate) fn decode(mut payload: Vec<u8>) -> Result<StoredSnapshot, postcard::Error> {
        let (meta, rest) = postcard::take_from_bytes(&payload)?;
        let (len, rest) = postcard::take_from_bytes::<u64>(rest)?;
        let len = usize::try_from(len)
            .ok()
            .filter(|&len| len <= rest.len())
            .ok_or(postcard::Error::DeserializeUnexpectedEnd)?;
        let start = payload.len() - rest.len();
        payload.truncate(start + len);
        payload.drain(..start);
        Ok(StoredSnapshot {
            meta,
            data: payload,
        })
    }
}

/// A member's open data directory, holding its `flock`.
pub(crate) struct MemberDir {
    _lock: fs::File,
}

/// What a start finds.
pub(crate) struct Opened {
    pub dir: MemberDir,
    pub log: RaftLog,
    pub snapshot: Option<StoredSnapshot>,
    pub snapshots: SnapshotFile,
    pub tokens: TokenCeiling,
    /// After a forced recovery: the ceiling, which every token from now on
    /// must be above.
    pub token_floor: Option<u64>,
}

/// Where the newest snapshot is kept (any thread may write it).
#[derive(Debug, Clone)]
pub(crate) struct SnapshotFile {
    dir: PathBuf,
}

/// The durable fencing-token ceiling, kept by the core.
#[derive(Debug)]
pub(crate) struct TokenCeiling {
    dir: PathBuf,
    ceiling: u64,
}

impl MemberDir {
    /// Opens (creating if needed) and locks `data_dir`, checks it and loads
    /// the snapshot and the Raft log.
    pub(crate) fn open(
        data_dir: &Path,
        config: &ServerConfig,
        write_cache: Option<Arc<dyn WriteCache>>,
    ) -> Result<Opened, ServerError> {
        files::make_owner_only(data_dir)?;
        let lock = files::lock_dir(data_dir)?;
        if data_dir.join(RESTORING).exists() {
            return Err(ServerError::Incompatible {
                path: data_dir.join(RESTORING),
                detail: "a restore into this directory did not finish (it was stopped or \
                         failed midway), so part of the backup's state is missing; nothing was \
                         changed: remove the directory and run the restore again"
                    .into(),
            });
        }
        let single_server_layout =
            data_dir.join("MANIFEST").exists() || !files::list_segments(data_dir)?.is_empty();
        if single_server_layout && !data_dir.join("raft").exists() {
            return Err(ServerError::Incompatible {
                path: data_dir.to_owned(),
                detail: "this directory holds the single server's layout of a development \
                         version (MANIFEST, snapshot, log-*), which no release wrote and this \
                         one does not read: start with an empty directory"
                    .into(),
            });
        }
        let raft_dir = data_dir.join("raft");
        // A member that ever started has a Raft log manifest, and a token
        // ceiling written before it.
        let existing = raft_dir.join("RAFTLOG").exists();
        let ceiling = TokenCeiling::read(data_dir, existing)?;
        if !existing && ceiling > 0 {
            return Err(ServerError::Missing {
                path: raft_dir.join("RAFTLOG"),
                detail: format!(
                    "TOKENS says fencing tokens up to {ceiling} may have been handed out here, \
                     but there is no Raft log: a member started afresh would hand them out \
                     again; nothing was changed: restore the directory from a backup, or \
                     replace this member"
                ),
            });
        }
        let mut tokens = TokenCeiling {
            dir: data_dir.to_owned(),
            ceiling,
        };
        if !existing {
            // Before the log's manifest: a member with a log has a ceiling.
            let path = data_dir.join("TOKENS");
            tokens
                .write()
                .map_err(|e| io_error("cannot write", &path, e))?;
        }
        // Creates it owner-only, or restricts an existing one.
        files::make_owner_only(&raft_dir)?;
        let mut recovery = Recovery {
            allowed: config.recover_damaged_data,
            data_dir,
            evidence: None,
        };
        let log = match RaftLog::read(&raft_dir, false) {
            Ok(log) => log,
            Err(error) => {
                recovery.damaged(error)?;
                RaftLog::read(&raft_dir, true)?
            }
        };
        let snapshots = SnapshotFile {
            dir: data_dir.to_owned(),
        };
        let snapshot = match snapshots.load() {
            Ok(snapshot) => snapshot,
            Err(error) => {
                recovery.damaged(error)?;
                None
            }
        };
        let covered = check_covers(&snapshots.path(), snapshot.as_ref(), log.purged().as_ref());
        let (log, snapshot) = match covered {
            Ok(()) => (
                log.start(config.segment_bytes, config.execution, write_cache)?,
                snapshot,
            ),
            Err(error) => {
                // The log after a purge means nothing without the state
                // before it: nothing is kept.
                recovery.damaged(error)?;
                drop(log);
                fs::remove_dir_all(&raft_dir)
                    .map_err(|e| io_error("cannot remove", &raft_dir, e))?;
                let _ = fs::remove_file(snapshots.path());
                files::make_owner_only(&raft_dir)?;
                (
                    RaftLog::open_on(
                        &raft_dir,
                        config.segment_bytes,
                        config.execution,
                        write_cache,
                    )?,
                    None,
                )
            }
        };
        // Half-written files of a start that was cut short go only once the
        // start is sure to go on: a refused start leaves every file as found,
        // and a forced recovery has kept them in its evidence already.
        for tmp in ["snapshot.tmp", "TOKENS.tmp"] {
            let _ = fs::remove_file(data_dir.join(tmp));
        }
        let token_floor = recovery.evidence.is_some().then_some(tokens.ceiling);
        Ok(Opened {
            dir: MemberDir { _lock: lock },
            log,
            snapshot,
            snapshots,
            tokens,
            token_floor,
        })
    }
}

/// A forced recovery in progress (or refused).
struct Recovery<'a> {
    allowed: bool,
    data_dir: &'a Path,
    /// Where the files were kept as found, once damage was met.
    evidence: Option<PathBuf>,
}

impl Recovery<'_> {
    /// Damage was found: refuses to start with `error` (other errors always
    /// refuse), or, under `recover_damaged_data`, keeps every file as found
    /// in `damaged-<time>/` (once) and lets the start go on.
    fn damaged(&mut self, error: ServerError) -> Result<(), ServerError> {
        let error = match error {
            ServerError::Corrupt { path, detail } if !self.allowed => ServerError::Corrupt {
                path,
                detail: format!("{detail}; {RECOVERY_HINT}"),
            },
            ServerError::Missing { path, detail } if !self.allowed => ServerError::Missing {
                path,
                detail: format!("{detail}; {RECOVERY_HINT}"),
            },
            error @ (ServerError::Corrupt { .. } | ServerError::Missing { .. }) => {
                tracing::error!(
                    %error,
                    "recovering what comes before the damage (recover_damaged_data): what comes \
                     after it is lost, and fencing tokens restart above every token handed out \
                     before"
                );
                if self.evidence.is_none() {
                    let evidence = files::keep_evidence(self.data_dir)?;
                    tracing::warn!(
                        evidence = %evidence.display(),
                        "the data directory is damaged: its files as found are kept"
                    );
                    self.evidence = Some(evidence);
                }
                return Ok(());
            }
            error => error,
        };
        Err(error)
    }
}

/// Said with every refusal that a forced recovery can get past.
const RECOVERY_HINT: &str = "nothing was changed; restore the data directory from a backup, \
     replace this member (wipe the directory and add it back under a new node id) if it is one \
     of several, or start with --recover-damaged-data (ServerConfig::recover_damaged_data) to \
     keep what comes before the damage (see docs/RELIABILITY.md)";

/// A log purged up to `purged` needs a snapshot covering it.
fn check_covers(
    path: &Path,
    snapshot: Option<&StoredSnapshot>,
    purged: Option<&LogIdOf<TypeConfig>>,
) -> Result<(), ServerError> {
    let Some(purged) = purged else {
        return Ok(());
    };
    let covered = snapshot.and_then(|s| s.meta.last_log_id.as_ref());
    if covered.is_some_and(|last| last.index >= purged.index) {
        return Ok(());
    }
    let found = match covered {
        Some(last) => format!("the snapshot covers entries up to {} only", last.index),
        None => "there is no snapshot".into(),
    };
    Err(ServerError::Missing {
        path: path.to_owned(),
        detail: format!(
            "the Raft log was purged up to entry {}, whose state only a snapshot holds, but \
             {found}",
            purged.index
        ),
    })
}

impl SnapshotFile {
    /// The snapshot of the data directory `dir`.
    pub(crate) fn in_dir(dir: &Path) -> SnapshotFile {
        SnapshotFile {
            dir: dir.to_owned(),
        }
    }

    fn path(&self) -> PathBuf {
        self.dir.join("snapshot")
    }

    /// The newest snapshot, if any.
    pub(crate) fn load(&self) -> Result<Option<StoredSnapshot>, ServerError> {
        let path = self.path();
        let Some(payload) = files::read_checked(&path, SNAPSHOT_MAGIC)? else {
            return Ok(None);
        };
        StoredSnapshot::decode(payload)
            .map(Some)
            .map_err(|e| ServerError::Corrupt {
                path,
                detail: format!("the snapshot does not decode: {e}"),
            })
    }

    /// Replaces the snapshot, atomically and durably.
    pub(crate) fn save(&self, meta: &SnapshotMetaOf<TypeConfig>, data: &[u8]) -> io::Result<()> {
        files::replace_durably(&self.dir, "snapshot", &stored_file(meta, data)?)
    }
}

/// The file of a [`StoredSnapshot`] of `meta` and `data`, framed: postcard's
/// layout (the data a byte string: its length, then the bytes), built in
/// one buffer sized up front, the data copied once rather than a byte at
/// a time through serde and then again into the frame.
fn stored_file(meta: &SnapshotMetaOf<TypeConfig>, data: &[u8]) -> io::Result<Vec<u8>> {
    const MOST_HEADER_BYTES: usize = 1024;
    let bytes = files::checked_buffer(data.len() + MOST_HEADER_BYTES);
    let bytes = postcard::to_extend(meta, bytes).map_err(io::Error::other)?;
    let mut bytes = postcard::to_extend(&(data.len() as u64), bytes).map_err(io::Error::other)?;
    bytes.extend_from_slice(data);
    Ok(files::seal(SNAPSHOT_MAGIC, bytes))
}

impl TokenCeiling {
    /// The ceiling in `dir/TOKENS`; a member that ever started must have
    /// it (`existing`), a new one starts at 0.
    fn read(dir: &Path, existing: bool) -> Result<u64, ServerError> {
        let path = dir.join("TOKENS");
        match files::read_checked(&path, TOKENS_MAGIC)? {
            Some(payload) => match postcard::from_bytes(&payload) {
                Ok(ceiling) if ceiling > TOKEN_LIMIT => Err(ServerError::Corrupt {
                    path,
                    detail: format!(
                        "the token ceiling {ceiling} is above 2^63 ({TOKEN_LIMIT}), which no \
                         member reaches: the file is not to be trusted"
                    ),
                }),
                Ok(ceiling) => Ok(ceiling),
                Err(e) => Err(ServerError::Corrupt {
                    path,
                    detail: format!("the token ceiling does not decode: {e}"),
                }),
            },
            None if existing => Err(ServerError::Missing {
                path,
                detail: "this member has a Raft log, so fencing tokens may have been handed \
                         out, and this file says up to which: without it the member cannot \
                         start, not even with --recover-damaged-data; restore TOKENS from a \
                         backup of this directory, or replace this member"
                    .into(),
            }),
            None => Ok(0),
        }
    }

    /// Writes `ceiling` as the ceiling of the new data directory `dir`.
    pub(crate) fn create(dir: &Path, ceiling: u64) -> io::Result<TokenCeiling> {
        let mut tokens = TokenCeiling {
            dir: dir.to_owned(),
            ceiling,
        };
        tokens.write()?;
        Ok(tokens)
    }

    /// No token above it was ever made visible by this member.
    pub(crate) fn ceiling(&self) -> u64 {
        self.ceiling
    }

    /// Makes the ceiling cover `last_token` before any reply carries it: a
    /// durable write when it passes the ceiling, nothing otherwise.
    pub(crate) fn cover(&mut self, last_token: u64) -> io::Result<()> {
        if last_token <= self.ceiling {
            return Ok(());
        }
        // Only a state past TOKEN_LIMIT, refused wherever it is read, gets
        // near the end: a stop with a message then, never an overflow.
        self.ceiling = last_token
            .checked_add(TOKEN_RESERVATION)
            .ok_or_else(|| io::Error::other("the fencing tokens are used up"))?;
        self.write()
    }

    fn write(&mut self) -> io::Result<()> {
        let payload = postcard::to_stdvec(&self.ceiling).map_err(io::Error::other)?;
        files::replace_durably(&self.dir, "TOKENS", &files::checked(TOKENS_MAGIC, &payload))
    }
}

#[cfg(test)]
mod tests {
    use openraft::type_config::alias::LeaderIdOf;
    use openraft::vote::RaftLeaderIdExt;

    use super::*;

    fn log_id(index: u64) -> LogIdOf<TypeConfig> {
        LogIdOf::<TypeConfig>::new(LeaderIdOf::<TypeConfig>::new_committed(1, 1), index)
    }

    fn snapshot(index: Option<u64>) -> StoredSnapshot {
        StoredSnapshot {
            meta: SnapshotMetaOf::<TypeConfig> {
                last_log_id: index.map(log_id),
                last_membership: Default::default(),
            },
            data: vec![1, 2, 3],
        }
    }

    #[test]
    fn a_snapshot_file_is_laid_out_as_serde_writes_it() {
        let mut stored = snapshot(Some(300));
        // Long enough that its length takes a varint of three bytes.
        stored.data = (0..70_000u32).map(|i| i as u8).collect();
        let through_serde = files::checked(SNAPSHOT_MAGIC, &postcard::to_stdvec(&stored).unwrap());
        assert_eq!(
            stored_file(&stored.meta, &stored.data).unwrap(),
            through_serde
        );
    }

    #[test]
    fn a_snapshot_file_reads_back_as_serde_reads_it() {
        let mut stored = snapshot(Some(300));
        stored.data = (0..70_000u32).map(|i| i as u8).collect();
        let bytes = postcard::to_stdvec(&stored).unwrap();
        let read = StoredSnapshot::decode(bytes.clone()).unwrap();
        let through_serde: StoredSnapshot = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(read.meta, through_serde.meta);
        assert_eq!(read.data, through_serde.data);
        // Cut anywhere, it does not decode; as serde, bytes after the data
        // are not read.
        for cut in [1, 5, 1_000, bytes.len() - 1] {
            assert!(
                StoredSnapshot::decode(bytes[..cut].to_vec()).is_err(),
                "{cut}"
            );
            assert!(postcard::from_bytes::<StoredSnapshot>(&bytes[..cut]).is_err());
        }
        let mut longer = bytes.clone();
        longer.push(9);
        assert_eq!(StoredSnapshot::decode(longer).unwrap().data, stored.data);
    }

    #[test]
    fn a_snapshot_round_trips_and_damage_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = SnapshotFile {
            dir: dir.path().to_owned(),
        };
        assert!(file.load().unwrap().is_none());
        let saved = snapshot(Some(7));
        file.save(&saved.meta, &saved.data).unwrap();
        let loaded = file.load().unwrap().unwrap();
        assert_eq!(loaded.meta.last_log_id, Some(log_id(7)));
        assert_eq!(loaded.data, [1, 2, 3]);
        let path = dir.path().join("snapshot");
        let mut bytes = fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        fs::write(&path, bytes).unwrap();
        let error = file.load().unwrap_err();
        assert!(matches!(error, ServerError::Corrupt { .. }), "{error}");
    }

    #[test]
    fn a_checked_file_announcing_more_bytes_than_any_file_holds_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = SNAPSHOT_MAGIC.to_vec();
        bytes.extend_from_slice(&1u32.to_le_bytes());
        bytes.extend_from_slice(&u64::MAX.to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes());
        fs::write(dir.path().join("snapshot"), &bytes).unwrap();
        let file = SnapshotFile {
            dir: dir.path().to_owned(),
        };
        let error = file.load().unwrap_err();
        assert!(matches!(error, ServerError::Corrupt { .. }), "{error}");
        assert!(error.to_string().contains("announced at byte 8"), "{error}");
    }

    #[test]
    fn a_purged_log_needs_a_snapshot_that_covers_it() {
        let path = Path::new("snapshot");
        assert!(check_covers(path, None, None).is_ok());
        assert!(check_covers(path, Some(&snapshot(Some(10))), Some(&log_id(10))).is_ok());
        for stale in [None, Some(snapshot(Some(9))), Some(snapshot(None))] {
            let error = check_covers(path, stale.as_ref(), Some(&log_id(10))).unwrap_err();
            assert!(matches!(error, ServerError::Missing { .. }), "{error}");
            assert!(
                error.to_string().contains("purged up to entry 10"),
                "{error}"
            );
        }
    }

    #[test]
    fn the_token_ceiling_only_rises_and_must_exist_once_the_member_started() {
        let dir = tempfile::tempdir().unwrap();
        let mut tokens = TokenCeiling {
            dir: dir.path().to_owned(),
            ceiling: TokenCeiling::read(dir.path(), false).unwrap(),
        };
        tokens.cover(5).unwrap();
        assert_eq!(tokens.ceiling, 5 + TOKEN_RESERVATION);
        tokens.cover(3).unwrap();
        assert_eq!(tokens.ceiling, 5 + TOKEN_RESERVATION);
        assert_eq!(
            TokenCeiling::read(dir.path(), true).unwrap(),
            5 + TOKEN_RESERVATION
        );
        fs::remove_file(dir.path().join("TOKENS")).unwrap();
        let error = TokenCeiling::read(dir.path(), true).unwrap_err();
        assert!(matches!(error, ServerError::Missing { .. }), "{error}");
    }
}
