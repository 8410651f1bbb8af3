//! Entry points of the fuzz targets in `fuzz/` (feature `fuzzing`; not part
//! of the API): the server's handling of bytes that come from outside the
//! process (a client's request, a peer's Raft message, a leader's snapshot,
//! the data directory), each reachable without a running server.
//!
//! Each target calls one function here, and the tests below replay each
//! target's seeds (`fuzz/seeds/<target>`) through the same function, so the
//! normal test suite catches a regression on any input a campaign ever
//! started from or failed on.

use std::fs;
use std::path::Path;

use arbitrary::{Arbitrary, Unstructured};

use locksmith_core::{ClientInfo, Command, Engine, SessionId};
use locksmith_proto::prost::Message;
use locksmith_proto::v1 as pb;
use openraft::raft::{AppendEntriesRequest, TransferLeaderRequest, VoteRequest};
use openraft::type_config::alias::{SnapshotMetaOf, VoteOf};

use crate::config::ServerConfig;
use crate::entry::TypeConfig;
use crate::error::ServerError;
use crate::history::{History, HistoryLimits};
use crate::requests::fuzzing::{stream_message, unary_requests};
use crate::storage::member::{MemberDir, StoredSnapshot};
use crate::storage::ServerSnapshot;

/// `bytes` as a client's request: decoded as a session stream's batch, and
/// as a `Sessions` stream's message (each channel's batch in turn), whose
/// messages go through the stream's checks and conversion (acquires on to a
/// lock engine), as each unary call's request, through its checks, and as
/// a framed session stream's hello, whose headers become the metadata the
/// caller is identified by.
pub fn client_request(bytes: &[u8]) {
    let config = ServerConfig::in_memory();
    let mut batches = Vec::new();
    if let Ok(batch) = pb::ClientBatch::decode(bytes) {
        batches.push(batch);
    }
    if let Ok(channels) = pb::ClientChannelBatches::decode(bytes) {
        batches.extend(channels.batches.into_iter().filter_map(|c| c.batch));
    }
    for batch in batches {
        let mut engine = Engine::new(config.limits.clone());
        let open = Command::OpenSession {
            session: SessionId(1),
            ttl: config.limits.min_ttl,
            info: ClientInfo::default(),
        };
        engine
            .apply(0, open, &mut Vec::new())
            .expect("a new engine opens a session");
        for message in batch.messages {
            stream_message(&config, message.kind, &mut engine);
        }
    }
    unary_requests(&config, bytes);
    if let Ok(hello) = pb::FramedHello::decode(bytes) {
        let _ = locksmith_proto::framed::metadata_of(hello);
    }
}

/// `bytes` as the payload of a peer's Raft call (append, vote, leader
/// transfer), the header of a snapshot it sends, or a follower's frame of
/// the framed replication stream.
pub fn peer_request(bytes: &[u8]) {
    let _ = locksmith_proto::framed::decode::<locksmith_proto::raft::AppendFrame>(bytes);
    let _ = postcard::from_bytes::<AppendEntriesRequest<TypeConfig>>(bytes);
    let _ = postcard::from_bytes::<VoteRequest<TypeConfig>>(bytes);
    let _ = postcard::from_bytes::<TransferLeaderRequest<TypeConfig>>(bytes);
    let _ = postcard::from_bytes::<(VoteOf<TypeConfig>, SnapshotMetaOf<TypeConfig>)>(bytes);
}

/// `bytes` as a snapshot's data (a leader's, installed) and as a member's
/// stored snapshot: decoded and, when it decodes, restored into a lock
/// engine and the grant history, as an install does.
pub fn snapshot(bytes: &[u8]) {
    if let Ok(stored) = StoredSnapshot::decode(bytes.to_vec()) {
        install(&stored.data);
    }
    install(bytes);
}

fn install(data: &[u8]) {
    let Ok(state) = ServerSnapshot::decode(data) else {
        return;
    };
    let config = ServerConfig::in_memory();
    // The history starts from any snapshot that decodes without panicking.
    let _history = History::new(HistoryLimits {
        per_lock: config.history_per_lock,
        total: config.history_total,
        max_age: config.history_max_age.as_millis() as u64,
    })
    .restored(&state.engine);
    // An inconsistent snapshot is refused; a consistent one must restore
    // into an engine that takes commands.
    let Ok(mut engine) = Engine::restore(config.limits, state.engine) else {
        return;
    };
    let _ = engine.snapshot();
    // Everything comes due: sessions, leases and waits expire, lock-delays
    // end, and the waiters left are granted, through what the snapshot set up.
    let now = u64::MAX / 4;
    let mut effects = Vec::new();
    for command in engine.due(now) {
        let _ = engine.apply(now, command, &mut effects);
    }
}

/// Opens `data_dir` as a start does (with `recover`, as
/// `--recover-damaged-data` does), and closes it again.
pub fn open_data_dir(data_dir: &Path, recover: bool) -> Result<(), ServerError> {
    let mut config = ServerConfig::durable(data_dir);
    config.recover_damaged_data = recover;
    // Outside any runtime: the log's writer on a thread of its own.
    config.execution = crate::config::Execution::Threads;
    MemberDir::open(data_dir, &config, None).map(drop)
}

/// The `data_dir` target: `bytes` (as `arbitrary` reads them) made into a
/// member's data directory in `scratch` (emptied first), which is opened as a
/// start does: it loads, or stops with an error naming what is wrong; it
/// never panics.
///
/// The files are written in the documented formats (module docs of
/// the `storage` module; from the documentation, not with the writer's code,
/// so that the reader is checked against what is documented), so that the
/// fuzzer gets past the checksums: a checked
/// file (`TOKENS`, `snapshot`, `raft/RAFTLOG`) is either raw bytes or a
/// payload framed with the right magic, format, length and CRC-32; a segment
/// is a raw header or a valid one, then frames either raw or sealed with the
/// segment's seed, then any tail.
pub fn data_dir(bytes: &[u8], scratch: &Path) {
    let Ok(input) = DataDir::arbitrary_take_rest(Unstructured::new(bytes)) else {
        return;
    };
    let _ = fs::remove_dir_all(scratch);
    let raft = scratch.join("raft");
    fs::create_dir_all(&raft).expect("scratch directory");
    if let Some(file) = &input.tokens {
        fs::write(scratch.join("TOKENS"), file.bytes(b"LSTK")).expect("write");
    }
    if let Some(file) = &input.snapshot {
        fs::write(scratch.join("snapshot"), file.bytes(b"LSSN")).expect("write");
    }
    if let Some(file) = &input.manifest {
        fs::write(raft.join("RAFTLOG"), file.bytes(b"LSRL")).expect("write");
    }
    for segment in input.segments.iter().take(4) {
        let path = raft.join(format!("log-{:020}", segment.seq));
        fs::write(path, segment.bytes()).expect("write");
    }
    let _ = open_data_dir(scratch, input.recover);
}

/// The files of a data directory, as the `data_dir` target makes them.
#[derive(Arbitrary, Debug)]
struct DataDir {
    tokens: Option<CheckedFile>,
    snapshot: Option<CheckedFile>,
    manifest: Option<CheckedFile>,
    segments: Vec<Segment>,
    recover: bool,
}

#[derive(Arbitrary, Debug)]
enum CheckedFile {
    /// A payload, framed as a checked file with the right magic.
    Framed(Vec<u8>),
    Raw(Vec<u8>),
}

impl CheckedFile {
    fn bytes(&self, magic: &[u8; 4]) -> Vec<u8> {
        match self {
            CheckedFile::Raw(bytes) => bytes.clone(),
            CheckedFile::Framed(payload) => {
                let mut bytes = magic.to_vec();
                bytes.extend_from_slice(&1u32.to_le_bytes());
                bytes.extend_from_slice(&(payload.len() as u64).to_le_bytes());
                bytes.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
                bytes.extend_from_slice(payload);
                bytes
            }
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Segment {
    seq: u64,
    header: SegmentHeader,
    frames: Vec<Frame>,
    tail: Vec<u8>,
}

#[derive(Arbitrary, Debug)]
enum SegmentHeader {
    /// A valid header for the file's number (or the one given).
    Valid {
        format: u32,
        seed: u32,
        seq: Option<u64>,
    },
    Raw(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
enum Frame {
    /// A payload (postcard records) in a frame with valid checksums.
    Sealed(Vec<u8>),
    Raw(Vec<u8>),
}

impl Segment {
    fn bytes(&self) -> Vec<u8> {
        let (mut bytes, seed) = match &self.header {
            SegmentHeader::Raw(bytes) => (bytes.clone(), 0),
            &SegmentHeader::Valid { format, seed, seq } => {
                let mut bytes = b"LSEG".to_vec();
                bytes.extend_from_slice(&format.to_le_bytes());
                bytes.extend_from_slice(&seq.unwrap_or(self.seq).to_le_bytes());
                bytes.extend_from_slice(&seed.to_le_bytes());
                let header_crc = crc32fast::hash(&bytes);
                bytes.extend_from_slice(&header_crc.to_le_bytes());
                (bytes, seed)
            }
        };
        for frame in &self.frames {
            match frame {
                Frame::Raw(raw) => bytes.extend_from_slice(raw),
                Frame::Sealed(payload) => {
                    let mut header = (payload.len() as u32).to_le_bytes().to_vec();
                    header.extend_from_slice(&seeded_crc(seed, payload).to_le_bytes());
                    let header_crc = seeded_crc(seed, &header);
                    bytes.extend_from_slice(&header);
                    bytes.extend_from_slice(&header_crc.to_le_bytes());
                    bytes.extend_from_slice(payload);
                }
            }
        }
        bytes.extend_from_slice(&self.tail);
        bytes
    }
}

fn seeded_crc(seed: u32, bytes: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new_with_initial(seed);
    hasher.update(bytes);
    hasher.finalize()
}

/// The seeds of each target, replayed: a panic on any of them fails the
/// test, naming the file.
#[cfg(test)]
mod tests {
    use locksmith_testkit::fuzz_seeds;

    #[test]
    fn client_request_seeds_replay() {
        for (path, bytes) in fuzz_seeds("client_request") {
            eprintln!("replaying {}", path.display());
            super::client_request(&bytes);
        }
    }

    #[test]
    fn peer_request_seeds_replay() {
        for (path, bytes) in fuzz_seeds("peer_request") {
            eprintln!("replaying {}", path.display());
            super::peer_request(&bytes);
        }
    }

    #[test]
    fn snapshot_seeds_replay() {
        for (path, bytes) in fuzz_seeds("snapshot") {
            eprintln!("replaying {}", path.display());
            super::snapshot(&bytes);
        }
    }

    #[test]
    fn data_dir_seeds_replay() {
        let scratch = tempfile::tempdir().expect("temporary directory");
        for (path, bytes) in fuzz_seeds("data_dir") {
            eprintln!("replaying {}", path.display());
            super::data_dir(&bytes, &scratch.path().join("data"));
        }
    }
}
