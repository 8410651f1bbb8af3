//! A member's data directory made of arbitrary files, opened as a start does
//! (and as `--recover-damaged-data` does): it loads, or stops with an error
//! naming what is wrong; it never panics.
//!
//! The harness writes the files itself in the documented formats (module
//! docs of `locksmith-server`'s `storage`), so that the fuzzer gets past the
//! checksums: a checked file (`TOKENS`, `snapshot`, `raft/RAFTLOG`) is either
//! raw bytes or a payload framed with the right magic, format, length and
//! CRC-32; a segment is a raw header or a valid one, then frames either raw
//! or sealed with the segment's seed, then any tail.
#![no_main]

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

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

fn checked(magic: &[u8; 4], file: &CheckedFile) -> Vec<u8> {
    match file {
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

fn crc(seed: u32, bytes: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new_with_initial(seed);
    hasher.update(bytes);
    hasher.finalize()
}

fn segment_bytes(segment: &Segment) -> Vec<u8> {
    let (mut bytes, seed) = match &segment.header {
        SegmentHeader::Raw(bytes) => (bytes.clone(), 0),
        &SegmentHeader::Valid { format, seed, seq } => {
            let mut bytes = b"LSEG".to_vec();
            bytes.extend_from_slice(&format.to_le_bytes());
            bytes.extend_from_slice(&seq.unwrap_or(segment.seq).to_le_bytes());
            bytes.extend_from_slice(&seed.to_le_bytes());
            let header_crc = crc32fast::hash(&bytes);
            bytes.extend_from_slice(&header_crc.to_le_bytes());
            (bytes, seed)
        }
    };
    for frame in &segment.frames {
        match frame {
            Frame::Raw(raw) => bytes.extend_from_slice(raw),
            Frame::Sealed(payload) => {
                let mut header = (payload.len() as u32).to_le_bytes().to_vec();
                header.extend_from_slice(&crc(seed, payload).to_le_bytes());
                let header_crc = crc(seed, &header);
                bytes.extend_from_slice(&header);
                bytes.extend_from_slice(&header_crc.to_le_bytes());
                bytes.extend_from_slice(payload);
            }
        }
    }
    bytes.extend_from_slice(&segment.tail);
    bytes
}

const SCRATCH_PREFIX: &str = "locksmith-fuzz-data-dir-";

/// A directory of this process's own, on tmpfs when there is one (a start
/// fsyncs, and writes a new segment of zeros).
///
/// libFuzzer ends the process without running destructors, so the last
/// input's directory stays; the first call removes those of processes that
/// are gone, so that runs do not pile them up in memory.
fn scratch() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let shm = Path::new("/dev/shm");
        let base = if shm.is_dir() {
            shm.to_owned()
        } else {
            std::env::temp_dir()
        };
        remove_orphans(&base);
        base.join(format!("{SCRATCH_PREFIX}{}", std::process::id()))
    })
}

/// Removes the scratch directories in `base` whose process has ended.
fn remove_orphans(base: &Path) {
    let Ok(entries) = fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(SCRATCH_PREFIX)) else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

fuzz_target!(|input: DataDir| {
    let dir = scratch();
    let _ = fs::remove_dir_all(dir);
    let raft = dir.join("raft");
    fs::create_dir_all(&raft).expect("scratch directory");
    if let Some(file) = &input.tokens {
        fs::write(dir.join("TOKENS"), checked(b"LSTK", file)).expect("write");
    }
    if let Some(file) = &input.snapshot {
        fs::write(dir.join("snapshot"), checked(b"LSSN", file)).expect("write");
    }
    if let Some(file) = &input.manifest {
        fs::write(raft.join("RAFTLOG"), checked(b"LSRL", file)).expect("write");
    }
    for segment in input.segments.iter().take(4) {
        let path = raft.join(format!("log-{:020}", segment.seq));
        fs::write(path, segment_bytes(segment)).expect("write");
    }
    let _ = locksmith_server::fuzzing::open_data_dir(dir, input.recover);
});
