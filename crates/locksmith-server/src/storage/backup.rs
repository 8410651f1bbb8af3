//! Backups of the replicated state, and the data directories of a new
//! cluster made from one (`locksmith snapshot save / status / restore`).
//!
//! # The file
//!
//! A backup is a checked file (`files.rs`: magic `LSBK`, framing format,
//! length, CRC-32 of the rest) whose payload is `postcard`, its own format
//! number first ([`BACKUP_FORMAT`]; a newer one is refused, never guessed):
//! where it came from, openraft's metadata (the one log id it is consistent
//! at, and the membership then), the highest token ceiling its source knew,
//! and the replicated state exactly as a member's snapshot holds it
//! (`ServerSnapshot`, with its own format number).
//!
//! It is taken two ways:
//!
//! - **from a live member** (`live`): the core freezes its applied state
//!   between two entries (the engine's locks shared copy-on-write, as for
//!   Raft's own snapshots) and goes on serving; encoding, checksumming and
//!   sending happen off its thread. Any member answers with its own applied
//!   state; the leader's is the newest. `locksmith snapshot save` asks a
//!   caught-up follower by default, so that the work falls off the member
//!   that serves the clients.
//! - **from a stopped member's data directory** ([`Backup::from_member_data`]),
//!   after a cluster lost its quorum for good: its snapshot plus every entry
//!   in its log, committed or not as far as it knows (an entry it holds may
//!   have been committed by the majority that is gone). Entries the lost
//!   majority committed without this member are lost. Refused unless the
//!   caller says `force_new_cluster`.
//!
//! # Tokens after a restore
//!
//! A cluster restored from a backup must never hand out a token that the
//! cluster it came from handed out, including tokens granted after the
//! backup was taken, which no backup can know. What a backup does know is
//! its token ceiling: the source member's durable ceiling (`TOKENS`) at the
//! moment the core froze the state, or the engine's last token on a member
//! that keeps none. The member had made no token above it visible by then:
//! the core covers a token with that ceiling, on disk, before a reply
//! carries it. (Entries committed but not yet applied then, on that member,
//! are past the backup's log index: their tokens count as granted after it.
//! So do the tokens a leader granted from entries a follower had not
//! applied when a backup was taken from the follower.) The restore
//! therefore starts tokens at that ceiling (at least the engine's last
//! token) plus [`TOKEN_JUMP`] (2^44, about 1.8e13), for the tokens granted
//! after the backup, or at `--token-floor` if an operator who knows more
//! gives a higher one. At 100 000 grants a second,
//! 2^44 tokens last more than five years after the backup; a floor is at
//! most 2^63 (a restore refuses a higher one), which leaves room for half a
//! million restores.
//!
//! # Sessions after a restore
//!
//! Sessions are kept with their secrets, holds and waiters: a client that
//! reaches the new cluster resumes its session (the new leader gives every
//! session a full TTL first, as after any election) and keeps its holds;
//! one that does not, expires after that TTL and its holds are released.
//! Their tokens are the old ones, below the floor; every new grant is above
//! it.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use openraft::storage::RaftLogStorage;
use openraft::type_config::alias::{SnapshotMetaOf, StoredMembershipOf, VoteOf};
use openraft::{BasicNode, Membership};
use serde::{Deserialize, Serialize};

use super::files::{self, io_error};
use super::member::{SnapshotFile, TokenCeiling, RESTORING, TOKEN_LIMIT};
use super::raft_log::RaftLog;
use super::snapshot::{encode_frozen, encode_frozen_after, FrozenState};
use super::ServerSnapshot;
use crate::config::{Execution, ServerConfig};
use crate::entry::{TypeConfig, RECORD_VERSION};
use crate::error::ServerError;
use locksmith_core::SnapshotCensus;

const BACKUP_MAGIC: &[u8; 4] = b"LSBK";
/// The payload format this server writes and the newest it reads.
pub const BACKUP_FORMAT: u32 = 1;
/// How far above every token a backup knows a restored cluster starts (see
/// the module docs).
pub const TOKEN_JUMP: u64 = 1 << 44;

/// Where a backup came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Origin {
    /// A running member's applied state.
    Live,
    /// A stopped member's data directory, with every entry it held
    /// (`committed`: the last one it knew committed).
    MemberData {
        /// The last entry the member knew committed.
        committed: Option<u64>,
    },
}

/// What a backup file's payload holds before its state.
///
/// The payload is this, then the state (`ServerSnapshot`, encoded) as
/// postcard lays out a byte string: its length as a varint, then the
/// bytes. The state is written and read in one piece, in place, not through
/// serde as a sequence of `u8` (64 MB of them for a million locks).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Header {
    /// [`BACKUP_FORMAT`], first, so that a newer one is told before the
    /// rest is read.
    format: u32,
    origin: Origin,
    /// The member it was taken from.
    node_id: u64,
    /// Unix time in milliseconds.
    saved_at_ms: u64,
    /// The log id it is consistent at, and the membership then.
    meta: SnapshotMetaOf<TypeConfig>,
    /// No token above it had been made visible when the state was frozen:
    /// the source member's durable ceiling (module docs). Backups of
    /// earlier versions taken from a live member have 0 here.
    token_ceiling: u64,
}

/// A backup, read and checked.
#[derive(Debug)]
pub struct Backup {
    header: Header,
    state: ServerSnapshot,
}

/// What a backup holds, for `locksmith snapshot status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// The backup file's format.
    pub format: u32,
    /// The replicated state's format inside it.
    pub state_format: u64,
    /// The newest log record version every member of the source cluster
    /// read: a restore needs a build that reads it.
    pub record_version: u32,
    /// `live` or `member-data`.
    pub origin: &'static str,
    /// The member it was taken from.
    pub node_id: u64,
    /// When, in Unix milliseconds.
    pub saved_at_ms: u64,
    /// The log index it is consistent at (none for an empty cluster).
    pub index: Option<u64>,
    /// The term of that entry.
    pub term: Option<u64>,
    /// The source cluster's voters and learners then: `(id, address, voter)`.
    pub members: Vec<(u64, String, bool)>,
    /// Locks held.
    pub locks: usize,
    /// Holds (a shared lock or semaphore has several).
    pub holds: usize,
    /// Acquires waiting.
    pub waiters: usize,
    /// Open sessions.
    pub sessions: usize,
    /// The highest token the state had handed out.
    pub last_token: u64,
    /// The highest token ceiling the source knew (its durable reservation).
    pub token_ceiling: u64,
    /// Where a restore starts tokens without `--token-floor`.
    pub restore_floor: u64,
}

/// Where and as what a restore makes a member's data directory.
#[derive(Debug, Clone)]
pub struct RestoreOptions {
    /// The new member's data directory: absent or empty.
    pub data_dir: PathBuf,
    /// The new member's id.
    pub node_id: u64,
    /// The new cluster's members, `(id, HOST:PORT)`, this one among them:
    /// every member is restored from the same backup with the same list.
    pub members: Vec<(u64, String)>,
    /// Start tokens above this, if higher than the backup's own floor.
    pub token_floor: Option<u64>,
}

/// What a restore made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// Every token the new cluster hands out is above this.
    pub token_floor: u64,
    /// The log index the new cluster's log starts after.
    pub index: Option<u64>,
}

/// A backup of `frozen`, the applied state of member `node_id`: the bytes
/// of the file.
///
/// The state is encoded in place, into the one buffer that is sent: after
/// room for the file's header, the backup's header and the state's length
/// (a varint of at most 10 bytes, known only once the state is encoded),
/// whose end these then fill. The file is the slice from where they begin:
/// no copy of tens of megabytes into another buffer.
pub(crate) fn live(frozen: FrozenState, node_id: u64) -> bytes::Bytes {
    const MOST_LENGTH_BYTES: usize = 10;
    let header = Header::of(&frozen, Origin::Live, node_id);
    let head = postcard::to_stdvec(&header).expect("a backup always encodes");
    let room = files::CHECKED_HEADER + head.len() + MOST_LENGTH_BYTES;
    let mut bytes = encode_frozen_after(&frozen, vec![0; room]);
    let length = postcard::to_stdvec(&((bytes.len() - room) as u64)).expect("a length encodes");
    let start = room - length.len() - head.len() - files::CHECKED_HEADER;
    let header_at = start + files::CHECKED_HEADER;
    bytes[header_at..header_at + head.len()].copy_from_slice(&head);
    bytes[room - length.len()..room].copy_from_slice(&length);
    files::seal_in_place(BACKUP_MAGIC, &mut bytes[start..]);
    bytes::Bytes::from(bytes).slice(start..)
}

impl Header {
    /// The header of a backup of `frozen`, with the token ceiling it was
    /// frozen with.
    fn of(frozen: &FrozenState, origin: Origin, node_id: u64) -> Header {
        Header {
            format: BACKUP_FORMAT,
            origin,
            node_id,
            saved_at_ms: unix_ms(),
            meta: frozen.meta.clone(),
            token_ceiling: frozen.token_ceiling,
        }
    }
}

/// A backup's payload, `header` then `state`, appended to `bytes`.
fn payload(header: &Header, state: &[u8], bytes: Vec<u8>) -> Vec<u8> {
    let mut bytes = postcard::to_extend(header, bytes).expect("a backup always encodes");
    // A byte string as postcard lays one out: its length, then the bytes.
    bytes = postcard::to_extend(&(state.len() as u64), bytes).expect("a length encodes");
    bytes.extend_from_slice(state);
    bytes
}

/// A backup's payload, its format checked: the header, and the state's
/// bytes where they lie.
fn split<'a>(path: &Path, bytes: &'a [u8]) -> Result<(Header, &'a [u8]), ServerError> {
    let (format, _) = postcard::take_from_bytes::<u32>(bytes)
        .map_err(|e| corrupt(path, format!("no backup format number: {e}")))?;
    if format > BACKUP_FORMAT {
        return Err(ServerError::Incompatible {
            path: path.to_owned(),
            detail: format!(
                "a backup of format {format}, written by a newer version: this one reads \
                 formats up to {BACKUP_FORMAT}; restore it with the version that saved it"
            ),
        });
    }
    let does_not_decode = |e| corrupt(path, format!("the backup does not decode: {e}"));
    let (header, rest) = postcard::take_from_bytes::<Header>(bytes).map_err(does_not_decode)?;
    let (state, _) = postcard::take_from_bytes::<&[u8]>(rest).map_err(does_not_decode)?;
    Ok((header, state))
}

/// What a backup's payload holds, checked as [`Backup::decode`] checks it,
/// without building its state: `locksmith snapshot save` checks a million
/// locks where the bytes lie (`ServerSnapshot::census`).
fn census(path: &Path, bytes: &[u8]) -> Result<Summary, ServerError> {
    let (header, state) = split(path, bytes)?;
    let census = ServerSnapshot::census(state).map_err(|detail| state_error(path, detail))?;
    let engine = census.engine.map_err(|e| inconsistent(path, &e))?;
    Ok(Summary::new(
        &header,
        (census.format, census.cluster_version),
        census.sessions,
        &engine,
    ))
}

fn corrupt(path: &Path, detail: String) -> ServerError {
    ServerError::Corrupt {
        path: path.to_owned(),
        detail,
    }
}

/// The state does not decode: written by a newer version, or damaged.
fn state_error(path: &Path, detail: String) -> ServerError {
    if detail.contains("newer version") {
        ServerError::Incompatible {
            path: path.to_owned(),
            detail,
        }
    } else {
        corrupt(path, detail)
    }
}

fn inconsistent(path: &Path, e: &locksmith_core::SnapshotError) -> ServerError {
    corrupt(path, format!("the lock table does not hold together: {e}"))
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Summary {
    /// `formats`: the state's format and record version.
    fn new(
        header: &Header,
        (state_format, record_version): (u64, u32),
        sessions: usize,
        engine: &SnapshotCensus,
    ) -> Self {
        let last_log_id = header.meta.last_log_id;
        let membership = header.meta.last_membership.membership();
        let voters: Vec<u64> = membership.voter_ids().collect();
        Summary {
            format: header.format,
            state_format,
            record_version,
            origin: match header.origin {
                Origin::Live => "live",
                Origin::MemberData { .. } => "member-data",
            },
            node_id: header.node_id,
            saved_at_ms: header.saved_at_ms,
            index: last_log_id.map(|id| id.index),
            term: last_log_id.map(|id| id.leader_id.term),
            members: membership
                .nodes()
                .map(|(id, node)| (*id, node.addr.clone(), voters.contains(id)))
                .collect(),
            locks: engine.held,
            holds: engine.holds,
            waiters: engine.waiters,
            sessions,
            last_token: engine.last_token,
            token_ceiling: header.token_ceiling,
            restore_floor: restore_floor(header, engine.last_token),
        }
    }
}

/// Above every token a backup knows (its engine's last token and its
/// ceiling), by [`TOKEN_JUMP`].
fn restore_floor(header: &Header, last_token: u64) -> u64 {
    last_token
        .max(header.token_ceiling)
        .saturating_add(TOKEN_JUMP)
}

impl Backup {
    /// Reads and checks the backup at `path`: its checksum, its formats, and
    /// that its engine state holds together.
    pub fn read(path: &Path) -> Result<Backup, ServerError> {
        let Some(bytes) = files::read_checked(path, BACKUP_MAGIC)? else {
            return Err(ServerError::Missing {
                path: path.to_owned(),
                detail: "no such backup file".into(),
            });
        };
        Backup::decode(path, &bytes)
    }

    /// Checks `bytes`, a whole backup file received from a member, as
    /// [`Backup::read`] checks a file (`path` names it in errors).
    pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Backup, ServerError> {
        Backup::decode(path, files::unframe(path, bytes, BACKUP_MAGIC)?)
    }

    fn decode(path: &Path, bytes: &[u8]) -> Result<Backup, ServerError> {
        let (header, state) = split(path, bytes)?;
        let state = ServerSnapshot::decode(state).map_err(|detail| state_error(path, detail))?;
        state.engine.check().map_err(|e| inconsistent(path, &e))?;
        Ok(Backup { header, state })
    }

    /// A backup of `frozen`, the state of the stopped member's data
    /// directory `data_dir` replayed whole (`committed`: the index its log
    /// knew committed). [`Backup::from_member_data`] (in the core, which
    /// replays the log) makes it.
    pub(crate) fn of_member_data(
        data_dir: &Path,
        frozen: &FrozenState,
        committed: Option<u64>,
    ) -> Result<Backup, ServerError> {
        let header = Header::of(frozen, Origin::MemberData { committed }, 0);
        let bytes = payload(&header, &encode_frozen(frozen), Vec::new());
        Backup::decode(data_dir, &bytes)
    }

    /// Writes the backup to `path` durably (a temporary file renamed over
    /// it), owner-only: it holds the secrets that resume sessions.
    pub fn write(&self, path: &Path) -> Result<(), ServerError> {
        let state = self.state.encode();
        let bytes = payload(
            &self.header,
            &state,
            files::checked_buffer(state.len() + 1024),
        );
        write_file(path, &files::seal(BACKUP_MAGIC, bytes))
    }

    /// The engine's state in the backup.
    pub fn engine(&self) -> &locksmith_core::Snapshot {
        &self.state.engine
    }

    /// What the backup holds.
    pub fn summary(&self) -> Summary {
        let engine = &self.state.engine;
        let census = SnapshotCensus {
            last_token: engine.last_token,
            sessions: engine.sessions.len(),
            ending: engine.ending.len(),
            locks: engine.locks.len(),
            held: engine
                .locks
                .iter()
                .filter(|l| !l.holders.is_empty())
                .count(),
            holds: engine.locks.iter().map(|l| l.holders.len()).sum(),
            waiters: engine.waiters.len(),
        };
        Summary::new(
            &self.header,
            (self.state.format(), self.state.cluster_version),
            self.state.sessions.len(),
            &census,
        )
    }

    /// Above every token the backup knows, by [`TOKEN_JUMP`].
    fn restore_floor(&self) -> u64 {
        restore_floor(&self.header, self.state.engine.last_token)
    }

    /// Makes the data directory of one member of a new cluster from the
    /// backup (module docs: tokens, sessions). Refused, changing nothing,
    /// when the directory holds anything or the members do not name this
    /// one. It takes the backup: the state it writes is the backup's own,
    /// not a copy of a table that may hold a million locks.
    ///
    /// Cancel safety: dropped midway (or failed), the directory is half
    /// made and says so (a `RESTORING` file, written first and removed last): a
    /// second restore refuses it as not empty and a start refuses it as
    /// unfinished; remove it and restore again.
    pub async fn restore(self, options: &RestoreOptions) -> Result<Restored, ServerError> {
        let dir = options.data_dir.as_path();
        check_members(options)?;
        if self.state.cluster_version > RECORD_VERSION {
            return Err(ServerError::Incompatible {
                path: dir.to_owned(),
                detail: format!(
                    "the backup's cluster had agreed to log records of version {}, and this \
                     version writes and reads up to {RECORD_VERSION}: restore it with a version \
                     as new as the one that saved it",
                    self.state.cluster_version
                ),
            });
        }
        let occupied = match fs::read_dir(dir) {
            Ok(mut entries) => entries.next().is_some(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(e) => return Err(io_error("cannot list", dir, e)),
        };
        if occupied {
            return Err(ServerError::Incompatible {
                path: dir.to_owned(),
                detail: "a restore makes a new data directory: this one is not empty".into(),
            });
        }
        if let Some(floor) = options.token_floor.filter(|&floor| floor > TOKEN_LIMIT) {
            return Err(ServerError::Config(format!(
                "a token floor of {floor} is above 2^63 ({TOKEN_LIMIT}), which leaves the new \
                 cluster too few tokens to hand out"
            )));
        }
        let token_floor = self.restore_floor().max(options.token_floor.unwrap_or(0));
        if token_floor > TOKEN_LIMIT {
            return Err(ServerError::Corrupt {
                path: dir.to_owned(),
                detail: format!(
                    "the backup's tokens reach {token_floor} with the jump past them, above \
                     2^63 ({TOKEN_LIMIT}), which no cluster hands out: it is not to be trusted"
                ),
            });
        }
        let Backup { header, mut state } = self;
        state.engine.last_token = token_floor;
        let last_log_id = header.meta.last_log_id;
        let voters = options.members.iter().map(|(id, _)| *id).collect();
        let nodes: std::collections::BTreeMap<u64, BasicNode> = options
            .members
            .iter()
            .map(|(id, addr)| (*id, BasicNode::new(addr)))
            .collect();
        let membership = Membership::<u64, BasicNode>::new(vec![voters], nodes)
            .map_err(|e| ServerError::Config(format!("invalid members: {e}")))?;
        let meta = SnapshotMetaOf::<TypeConfig> {
            last_log_id,
            last_membership: StoredMembershipOf::<TypeConfig>::new(last_log_id, membership),
        };

        files::make_owner_only(dir)?;
        let _lock = files::lock_dir(dir)?;
        // Until it is removed, a start refuses the directory.
        files::replace_durably(dir, RESTORING, b"a restore is making this directory\n")
            .map_err(|e| io_error("cannot write", &dir.join(RESTORING), e))?;
        TokenCeiling::create(dir, token_floor)
            .map_err(|e| io_error("cannot write", &dir.join("TOKENS"), e))?;
        SnapshotFile::in_dir(dir)
            .save(&meta, &state.encode())
            .map_err(|e| io_error("cannot write", &dir.join("snapshot"), e))?;
        let raft_dir = dir.join("raft");
        let config = ServerConfig::durable(dir);
        // The writer on a thread of its own, which the log's drop joins: a
        // command that exits right after leaves nothing unwritten.
        let mut log = RaftLog::open_on(&raft_dir, config.segment_bytes, Execution::Threads, None)?;
        if let Some(last) = last_log_id {
            let raft_error = |e: io::Error| io_error("cannot write the Raft log in", &raft_dir, e);
            // A vote in the snapshot's term: the new cluster's first
            // election is in a later one, so its entries follow the
            // snapshot's in log order.
            let vote = VoteOf::<TypeConfig>::new(last.leader_id.term, options.node_id);
            log.save_vote(&vote).await.map_err(raft_error)?;
            log.save_committed(Some(last)).await.map_err(raft_error)?;
            log.purge(last).await.map_err(raft_error)?;
        }
        drop(log);
        let unfinished = dir.join(RESTORING);
        fs::remove_file(&unfinished)
            .and_then(|()| files::sync_dir(dir))
            .map_err(|e| io_error("cannot remove", &unfinished, e))?;
        Ok(Restored {
            token_floor,
            index: last_log_id.map(|id| id.index),
        })
    }
}

/// The members name this one, by positive ids, once each.
fn check_members(options: &RestoreOptions) -> Result<(), ServerError> {
    let ids: Vec<u64> = options.members.iter().map(|(id, _)| *id).collect();
    if ids.contains(&0) {
        return Err(ServerError::Config(
            "a member id is a number above 0".into(),
        ));
    }
    if !ids.contains(&options.node_id) {
        return Err(ServerError::Config(format!(
            "the members do not list this one (node id {})",
            options.node_id
        )));
    }
    let mut unique = ids.clone();
    unique.sort_unstable();
    unique.dedup();
    if unique.len() != ids.len() {
        return Err(ServerError::Config("a member id appears twice".into()));
    }
    Ok(())
}

/// Writes `bytes` to `path` atomically and durably, owner-only.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<(), ServerError> {
    let (dir, name) = dir_and_name(path)?;
    files::replace_durably(dir, name, bytes).map_err(|e| io_error("cannot write", path, e))
}

/// Lowers the calling thread's CPU priority as a member lowers the thread
/// that encodes a backup (nice +10); threads it starts afterwards inherit
/// it. And when this process leads a session of its own, the session's
/// share of the CPUs as well (a nice value weighs only within the group
/// the kernel schedules a session's threads in: `storage/background.rs`).
/// For `locksmith snapshot save`, which often runs on a member's own
/// machine: it then checks and writes the file with the CPU the member
/// leaves (docs/BENCHMARKS.md, "Snapshots sized by the log").
///
/// Returns the session group's nice value when it lowered it.
pub fn lower_priority_for_a_save() -> std::io::Result<Option<i32>> {
    let by = super::background::Background::Backup.nice();
    super::background::lower_priority(by);
    super::background::lower_session_priority(by)
}

/// What the backup at `path` holds, checked as [`Backup::read`] checks it
/// but without building its state.
pub fn inspect(path: &Path) -> Result<Summary, ServerError> {
    let Some(bytes) = files::read_checked(path, BACKUP_MAGIC)? else {
        return Err(ServerError::Missing {
            path: path.to_owned(),
            detail: "no such backup file".into(),
        });
    };
    census(path, &bytes)
}

/// A backup coming from a member, to be saved as a file once checked
/// (`locksmith snapshot save`). Each part is written to the file's staged
/// copy by a thread of its own as it comes ([`Incoming::push`]), so the
/// file is written while the rest is on its way and no buffer of the
/// backup's size is made (64 MB for a million locks, which the kernel
/// zeroes before it is filled); [`Incoming::finish`] then checks the staged
/// copy where the kernel keeps it, as [`Backup::from_bytes`] checks a backup
/// (without building its state, as [`inspect`]), and puts it in place only
/// if it passes. Dropped before, it leaves no staged copy.
pub struct Incoming {
    path: PathBuf,
    /// To the writer; `None` once finishing.
    parts: Option<tokio::sync::mpsc::Sender<bytes::Bytes>>,
    writer: Option<std::thread::JoinHandle<io::Result<(files::Staged, fs::File)>>>,
    received: u64,
}

/// Parts on their way to the writer at most: the disk's pace holds the
/// sender back (and, through the transport's flow control, the member),
/// rather than memory filling up.
const PARTS_IN_FLIGHT: usize = 8;

impl Incoming {
    /// Starts the staged copy of `path` (`path.tmp`) and its writer.
    pub fn start(path: &Path) -> Result<Incoming, ServerError> {
        let (dir, name) = dir_and_name(path)?;
        let staging =
            files::Staging::create(dir, name).map_err(|e| io_error("cannot write", path, e))?;
        let (parts, mut coming) = tokio::sync::mpsc::channel::<bytes::Bytes>(PARTS_IN_FLIGHT);
        let writer = std::thread::Builder::new()
            .name("locksmith-backup-writer".into())
            .spawn(move || {
                let mut staging = staging;
                while let Some(part) = coming.blocking_recv() {
                    staging.append(&part)?;
                }
                staging.finish()
            })
            .map_err(|e| io_error("cannot start a thread to write", path, e))?;
        Ok(Incoming {
            path: path.to_owned(),
            parts: Some(parts),
            writer: Some(writer),
            received: 0,
        })
    }

    /// Hands `part`, the next bytes of the backup, to the writer.
    ///
    /// Cancel safety: not safe to resume; dropped while waiting for room,
    /// the part is lost, so drop the whole [`Incoming`] with it.
    pub async fn push(&mut self, part: bytes::Bytes) -> Result<(), ServerError> {
        let len = part.len() as u64;
        let sent = match &self.parts {
            Some(parts) => parts.send(part).await.is_ok(),
            None => false,
        };
        if !sent {
            // The writer stopped on an error: it is in its result.
            return self.written().map(drop);
        }
        self.received += len;
        Ok(())
    }

    /// Bytes received so far.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// Waits for the writer to make every part durable, checks the file,
    /// and puts it in place of `path` if it passes; returns what it holds.
    /// Blocking: a read of the whole file, and an `fsync` or two.
    pub fn finish(mut self) -> Result<Summary, ServerError> {
        let path = self.path.clone();
        let (staged, file) = self.written()?;
        // SAFETY: the map is of the staged copy this process has just
        // written and synced, owner-only under a name of its own, and is
        // only read. Another process truncating it meanwhile would make a
        // read fault (SIGBUS).
        let bytes = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|e| io_error("cannot read back", &path, e))?;
        // Checked giving way, as a member encodes it (module `background`):
        // run on a member's machine, the check leaves waking threads a CPU.
        let summary = super::background::giving_way(|| {
            files::unframe(&path, &bytes, BACKUP_MAGIC).and_then(|payload| census(&path, payload))
        })?;
        // A backup that does not check out was refused above; its staged
        // copy is removed as it drops.
        staged
            .replace()
            .map_err(|e| io_error("cannot write", &path, e))?;
        Ok(summary)
    }

    /// The writer's result, once every part sent is written and synced.
    fn written(&mut self) -> Result<(files::Staged, fs::File), ServerError> {
        self.parts = None;
        let Some(writer) = self.writer.take() else {
            let stopped = io::Error::other("the writer has stopped");
            return Err(io_error("cannot write", &self.path, stopped));
        };
        writer
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            .map_err(|e| io_error("cannot write", &self.path, e))
    }
}

impl Drop for Incoming {
    /// Waits for the writer, which then drops the staged copy: removed
    /// before another [`Incoming`] for the same file (a save that turns to
    /// another member) stages its own under the same name.
    fn drop(&mut self) {
        self.parts = None;
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

/// The directory `path` is in, and its file name.
fn dir_and_name(path: &Path) -> Result<(&Path, &str), ServerError> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| ServerError::Config(format!("{} names no file", path.display())))?;
    Ok((dir, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Saves `bytes` as `locksmith snapshot save` saves what it receives,
    /// in parts.
    fn save_checked(path: &Path, bytes: &[u8]) -> Result<Summary, ServerError> {
        let mut incoming = Incoming::start(path)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            for part in bytes.chunks(3) {
                incoming.push(bytes::Bytes::copy_from_slice(part)).await?;
            }
            Ok::<_, ServerError>(())
        })?;
        assert_eq!(incoming.received(), bytes.len() as u64);
        incoming.finish()
    }

    #[test]
    fn a_save_dropped_unfinished_leaves_nothing_and_the_next_one_saves() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("backup");
        let bytes = live(frozen(2, 2), 3);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut dropped = Incoming::start(&path).unwrap();
        runtime.block_on(dropped.push(bytes.slice(..10))).unwrap();
        drop(dropped);
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            0,
            "no staged copy left"
        );
        // As a save that turns to the leader when a follower fails it.
        let summary = save_checked(&path, &bytes).unwrap();
        assert_eq!((summary.locks, summary.node_id), (2, 3));
        assert_eq!(fs::read(&path).unwrap(), bytes);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_backup_of_a_newer_format_is_refused_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("backup");
        let mut bytes = postcard::to_stdvec(&(BACKUP_FORMAT + 1)).unwrap();
        bytes.extend_from_slice(b"whatever a newer version writes");
        fs::write(&path, files::checked(BACKUP_MAGIC, &bytes)).unwrap();
        let error = Backup::read(&path).unwrap_err();
        assert!(matches!(error, ServerError::Incompatible { .. }), "{error}");
        assert!(error.to_string().contains("newer version"), "{error}");
    }

    #[test]
    fn a_checked_file_framed_by_a_newer_version_is_refused_as_such() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("backup");
        let mut bytes = files::checked(BACKUP_MAGIC, b"\x01abc");
        bytes[4] += 1;
        fs::write(&path, bytes).unwrap();
        let error = Backup::read(&path).unwrap_err();
        assert!(matches!(error, ServerError::Incompatible { .. }), "{error}");
        assert!(error.to_string().contains("newer version"), "{error}");
    }

    /// The payload as it was first laid out: one struct, the state a
    /// `Vec<u8>` through serde.
    #[derive(Serialize)]
    struct FormatOnePayload {
        format: u32,
        origin: Origin,
        node_id: u64,
        saved_at_ms: u64,
        meta: SnapshotMetaOf<TypeConfig>,
        token_ceiling: u64,
        state: Vec<u8>,
    }

    #[test]
    fn the_state_written_in_one_piece_is_laid_out_as_before_and_reads_both_ways() {
        let state =
            ServerSnapshot::new(8_000, 2, 3, 4, locksmith_core::Snapshot::default(), vec![])
                .encode();
        let header = Header {
            format: BACKUP_FORMAT,
            origin: Origin::Live,
            node_id: 2,
            saved_at_ms: 1_700_000_000_000,
            meta: SnapshotMetaOf::<TypeConfig>::default(),
            token_ceiling: 1_000_042,
        };
        let as_before = postcard::to_stdvec(&FormatOnePayload {
            format: header.format,
            origin: header.origin,
            node_id: header.node_id,
            saved_at_ms: header.saved_at_ms,
            meta: header.meta.clone(),
            token_ceiling: header.token_ceiling,
            state: state.clone(),
        })
        .unwrap();
        let written = payload(&header, &state, Vec::new());
        assert_eq!(written, as_before);

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("backup");
        fs::write(&path, files::checked(BACKUP_MAGIC, &as_before)).unwrap();
        let read = Backup::read(&path).unwrap();
        assert_eq!(read.summary().token_ceiling, 1_000_042);
        assert_eq!(read.state.encode(), state);
        let saved = dir.path().join("saved");
        let received = fs::read(&path).unwrap();
        save_checked(&saved, &received).unwrap();
        assert_eq!(fs::read(&saved).unwrap(), received);
    }

    #[test]
    fn a_backup_that_does_not_check_out_replaces_nothing_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("backup");
        fs::write(&path, b"the backup before").unwrap();
        let damaged = files::checked(BACKUP_MAGIC, b"\x01abc");
        assert!(save_checked(&path, &damaged).is_err());
        assert_eq!(fs::read(&path).unwrap(), b"the backup before");
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no staged copy left"
        );
    }

    #[test]
    fn a_damaged_backup_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("backup");
        fs::write(&path, files::checked(BACKUP_MAGIC, b"\x01abc")).unwrap();
        let mut bytes = fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        fs::write(&path, bytes).unwrap();
        let error = Backup::read(&path).unwrap_err();
        assert!(error.to_string().contains("checksum"), "{error}");
    }

    /// A frozen state of one session holding lock "a" (token 1) and a
    /// second lock, "b", held by a lease alone; `last_token` as given.
    fn frozen(cluster_version: u32, last_token: u64) -> FrozenState {
        use locksmith_core::{
            ClientInfo, Engine, HoldSnapshot, Limits, LockSnapshot, Mode, SessionId,
            SessionSnapshot, Snapshot,
        };
        let hold = |session: u64, token: u64, lease_until: Option<u64>| HoldSnapshot {
            session: SessionId(session),
            owner: "o".into(),
            mode: Mode::Exclusive,
            token,
            count: 1,
            lock_time: 1,
            lease_until,
            lock_delay: 0,
        };
        let lock = |name: &str, hold: HoldSnapshot| LockSnapshot {
            name: name.into(),
            holders: vec![hold],
            queue: Vec::new(),
            delay_until: None,
        };
        let snapshot = Snapshot {
            last_token,
            sessions: vec![SessionSnapshot {
                session: SessionId(1),
                ttl: 5_000,
                info: ClientInfo::default(),
                expires_at: 9_000,
            }],
            locks: vec![
                lock("a", hold(1, 1, None)),
                lock("b", hold(0, 2, Some(60_000))),
            ],
            waiters: Vec::new(),
            ending: Vec::new(),
        };
        let engine = Engine::restore(Limits::default(), snapshot).unwrap();
        FrozenState {
            meta: SnapshotMetaOf::<TypeConfig>::default(),
            last_now: 8_000,
            cluster_version,
            next_session: 2,
            next_unary: 1,
            engine: engine.freeze(),
            sessions: Vec::new(),
            token_ceiling: 1_000,
        }
    }

    #[test]
    fn sessions_frozen_in_any_order_are_written_in_the_order_of_their_ids() {
        use crate::storage::SessionRecord;
        let record = |session: u64| SessionRecord {
            session,
            secret: u128::from(session) * 7,
            ttl: 5_000,
            replies: Vec::new(),
            lost: Vec::new(),
        };
        let mut shuffled = frozen(2, 2);
        shuffled.sessions = vec![record(3), record(1), record(2)];
        let mut sorted = frozen(2, 2);
        sorted.sessions = vec![record(1), record(2), record(3)];
        let written = encode_frozen(&shuffled);
        assert_eq!(written, encode_frozen(&sorted));
        let read = ServerSnapshot::decode(&written).unwrap();
        let ids: Vec<u64> = read.sessions.iter().map(|s| s.session).collect();
        assert_eq!(ids, [1, 2, 3]);
    }

    #[test]
    fn a_live_backup_encoded_in_place_is_laid_out_as_one_written_in_pieces() {
        let path = Path::new("backup");
        for cluster_version in [1, 2] {
            let bytes = live(frozen(cluster_version, 2), 3);
            let payload_read = files::unframe(path, &bytes, BACKUP_MAGIC).unwrap();
            let (header, state) = split(path, payload_read).unwrap();
            assert_eq!(state, encode_frozen(&frozen(cluster_version, 2)));
            let in_pieces = files::checked(BACKUP_MAGIC, &payload(&header, state, Vec::new()));
            assert_eq!(&bytes[..], &in_pieces[..]);

            let built = Backup::from_bytes(path, &bytes).unwrap().summary();
            assert_eq!(census(path, payload_read).unwrap(), built);
            assert_eq!((built.locks, built.holds, built.node_id), (2, 2, 3));
            assert_eq!(built.restore_floor, 1_000 + TOKEN_JUMP);
        }
    }

    /// Checked without being built, a backup whose lock table does not hold
    /// together is refused as a restore refuses it, and replaces nothing.
    #[test]
    fn a_backup_whose_lock_table_does_not_hold_together_is_refused_unbuilt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("backup");
        fs::write(&path, b"the backup before").unwrap();
        let frozen = frozen(2, 2);
        let header = Header::of(&frozen, Origin::Live, 3);
        // Lock "b"'s token 2, above the last one issued: never issued.
        let mut engine = frozen.engine.into_snapshot();
        engine.last_token = 1;
        let state = ServerSnapshot::new(8_000, 2, 2, 1, engine, Vec::new()).encode();
        let bytes = files::checked(BACKUP_MAGIC, &payload(&header, &state, Vec::new()));

        let error = save_checked(&path, &bytes).unwrap_err().to_string();
        assert!(error.contains("does not hold together"), "{error}");
        assert!(error.contains("never issued"), "{error}");
        assert_eq!(fs::read(&path).unwrap(), b"the backup before");
        fs::write(&path, &bytes).unwrap();
        for error in [
            inspect(&path).unwrap_err(),
            Backup::read(&path).unwrap_err(),
        ] {
            assert!(matches!(error, ServerError::Corrupt { .. }), "{error}");
            assert!(error.to_string().contains("never issued"), "{error}");
        }
    }

    /// A backup of [`frozen`] at log index 10 of term 1.
    fn at_index_ten(cluster_version: u32, last_token: u64) -> Backup {
        use openraft::type_config::alias::{LeaderIdOf, LogIdOf};
        use openraft::vote::RaftLeaderIdExt;
        let mut frozen = frozen(cluster_version, last_token);
        frozen.meta.last_log_id = Some(LogIdOf::<TypeConfig>::new(
            LeaderIdOf::<TypeConfig>::new_committed(1, 1),
            10,
        ));
        Backup::from_bytes(Path::new("backup"), &live(frozen, 1)).unwrap()
    }

    fn one_member(data_dir: &Path, token_floor: Option<u64>) -> RestoreOptions {
        RestoreOptions {
            data_dir: data_dir.to_owned(),
            node_id: 1,
            members: vec![(1, "127.0.0.1:1".into())],
            token_floor,
        }
    }

    fn start(data_dir: &Path) -> Result<super::super::member::Opened, ServerError> {
        super::super::member::MemberDir::open(data_dir, &ServerConfig::durable(data_dir), None)
    }

    #[tokio::test]
    async fn a_restore_cut_short_is_refused_by_a_start_and_a_second_restore() {
        use std::future::Future;
        use std::task::{Context, Poll};
        let dir = tempfile::tempdir().unwrap();
        // Dropped at its first wait (the log's writer syncing the vote),
        // when the ceiling, the snapshot and the log are written but the
        // log is not yet purged up to the snapshot: a restore cut short.
        // Each try is a new directory; one that ran through without a
        // wait proves nothing and is tried again.
        let cut = (0..20)
            .map(|i| dir.path().join(format!("m{i}")))
            .find(|data_dir| {
                let options = one_member(data_dir, None);
                let mut restore = std::pin::pin!(at_index_ten(RECORD_VERSION, 5).restore(&options));
                let waker = futures::task::noop_waker();
                matches!(
                    restore.as_mut().poll(&mut Context::from_waker(&waker)),
                    Poll::Pending
                )
            })
            .expect("a restore that waits for its log's writer");
        assert!(cut.join("snapshot").exists() && cut.join("raft/RAFTLOG").exists());
        let error = start(&cut).err().expect("refused");
        assert!(matches!(error, ServerError::Incompatible { .. }), "{error}");
        assert!(error.to_string().contains("did not finish"), "{error}");
        let again = at_index_ten(RECORD_VERSION, 5)
            .restore(&one_member(&cut, None))
            .await
            .unwrap_err();
        assert!(again.to_string().contains("not empty"), "{again}");

        // Made again from scratch: it starts, its ceiling at the floor.
        fs::remove_dir_all(&cut).unwrap();
        let restored = at_index_ten(RECORD_VERSION, 5)
            .restore(&one_member(&cut, None))
            .await
            .unwrap();
        assert!(!cut.join(RESTORING).exists());
        assert_eq!(start(&cut).unwrap().tokens.ceiling(), restored.token_floor);
    }

    #[tokio::test]
    async fn a_token_ceiling_without_a_raft_log_is_refused_not_started_afresh() {
        let dir = tempfile::tempdir().unwrap();
        let restored = at_index_ten(RECORD_VERSION, 5)
            .restore(&one_member(dir.path(), None))
            .await
            .unwrap();
        // The log gone (removed by hand, or a restore cut before it): a
        // fresh start would hand out tokens from 1 again.
        fs::remove_dir_all(dir.path().join("raft")).unwrap();
        let error = start(dir.path()).err().expect("refused");
        assert!(matches!(error, ServerError::Missing { .. }), "{error}");
        let message = error.to_string();
        assert!(
            message.contains(&restored.token_floor.to_string()),
            "{message}"
        );
        assert!(!dir.path().join("raft").join("RAFTLOG").exists());
    }

    #[tokio::test]
    async fn token_floors_and_ceilings_above_two_to_the_63_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let data_dir = dir.path().join("member");
        let error = at_index_ten(RECORD_VERSION, 5)
            .restore(&one_member(&data_dir, Some(u64::MAX - 1_000)))
            .await
            .unwrap_err();
        assert!(matches!(error, ServerError::Config(_)), "{error}");
        assert!(!data_dir.exists(), "nothing made");
        // A backup whose last token leaves no room for the jump past it.
        let error = at_index_ten(RECORD_VERSION, u64::MAX - 1_000)
            .restore(&one_member(&data_dir, None))
            .await
            .unwrap_err();
        assert!(matches!(error, ServerError::Corrupt { .. }), "{error}");
        assert!(!data_dir.exists(), "nothing made");
        // A ceiling on disk that high: refused at the start.
        fs::create_dir(&data_dir).unwrap();
        TokenCeiling::create(&data_dir, TOKEN_LIMIT + 1).unwrap();
        let error = start(&data_dir).err().expect("refused");
        assert!(matches!(error, ServerError::Corrupt { .. }), "{error}");
        assert!(error.to_string().contains("2^63"), "{error}");
    }

    #[tokio::test]
    async fn a_log_segment_of_a_newer_format_is_refused_even_when_recovering() {
        let dir = tempfile::tempdir().unwrap();
        at_index_ten(RECORD_VERSION, 5)
            .restore(&one_member(dir.path(), None))
            .await
            .unwrap();
        let raft_dir = dir.path().join("raft");
        let segment = *files::list_segments(&raft_dir).unwrap().last().unwrap();
        let path = files::segment_path(&raft_dir, segment);
        let mut bytes = fs::read(&path).unwrap();
        bytes[4..8].copy_from_slice(&(super::super::segment::SEGMENT_FORMAT + 1).to_le_bytes());
        let checksum = crc32fast::hash(&bytes[0..20]);
        bytes[20..24].copy_from_slice(&checksum.to_le_bytes());
        fs::write(&path, &bytes).unwrap();
        let mut config = ServerConfig::durable(dir.path());
        config.recover_damaged_data = true;
        let error = super::super::member::MemberDir::open(dir.path(), &config, None)
            .err()
            .expect("refused");
        assert!(matches!(error, ServerError::Incompatible { .. }), "{error}");
        assert!(error.to_string().contains("newer version"), "{error}");
        assert_eq!(
            fs::read(&path).unwrap(),
            bytes,
            "the segment is kept as found"
        );
        let kept: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .filter(|name| name.starts_with("damaged"))
            .collect();
        assert!(kept.is_empty(), "nothing treated as damage: {kept:?}");
    }

    #[tokio::test]
    async fn a_backup_of_a_newer_record_version_is_not_restored() {
        let dir = tempfile::tempdir().unwrap();
        let data_dir = dir.path().join("member");
        let backup = at_index_ten(RECORD_VERSION + 1, 5);
        assert_eq!(backup.summary().record_version, RECORD_VERSION + 1);
        let error = backup
            .restore(&one_member(&data_dir, None))
            .await
            .unwrap_err();
        assert!(matches!(error, ServerError::Incompatible { .. }), "{error}");
        assert!(error.to_string().contains("as new as"), "{error}");
        assert!(!data_dir.exists(), "nothing made");
    }

    #[tokio::test]
    async fn member_data_needs_force_new_cluster_and_touches_nothing_without() {
        let dir = tempfile::tempdir().unwrap();
        let error = Backup::from_member_data(dir.path(), false)
            .await
            .unwrap_err();
        assert!(error.to_string().contains("--force-new-cluster"), "{error}");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
