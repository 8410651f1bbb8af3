//! Log segments: the header, frames of records, the scanner that tells an
//! incomplete last write from damage, and the segment being appended to. The
//! layout and the rules are in the [module docs](super).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::files::{owner_only, segment_path, sync_dir};
use crate::environment::WriteCache;

/// Bytes of a segment header.
pub(super) const SEGMENT_HEADER: usize = 24;
pub(super) const SEGMENT_MAGIC: &[u8; 4] = b"LSEG";
/// The format segments are written in: 2 holds [`super::Record`]s (1 held
/// only engine commands, [`super::LogRecord`]s, and is still read).
pub(super) const SEGMENT_FORMAT: u32 = 2;
/// The oldest format still read.
const OLDEST_SEGMENT_FORMAT: u32 = 1;
/// Bytes of a frame header: length, payload checksum, header checksum.
pub(super) const FRAME_HEADER: usize = 12;
/// A buffer starts a new frame once its open one holds this much: a commit
/// bigger than that (a rare, huge batch) is written as several frames, each
/// made durable before the next is written.
const FRAME_TARGET: usize = 1 << 20;
/// Zeros [`Segment::keep_zeros_ahead`] adds at a time: small enough that
/// writing and fsyncing them delays the next batch by well under a millisecond.
pub(super) const ZEROS_CHUNK: usize = 256 << 10;
/// [`Segment::keep_zeros_ahead`] adds a chunk of zeros when fewer are left.
pub(super) const ZEROS_LOW_WATER: u64 = 64 << 10;

/// CRC-32 of `parts`, started from the segment's seed.
fn checksum(seed: u32, parts: &[&[u8]]) -> u32 {
    let mut hasher = crc32fast::Hasher::new_with_initial(seed);
    for part in parts {
        hasher.update(part);
    }
    hasher.finalize()
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

/// What a segment's header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SegmentHeader {
    /// The segment's number (also in its file name).
    pub seq: u64,
    /// Where its frames' checksums start.
    pub seed: u32,
    /// The format its frames are in.
    pub format: u32,
}

/// Why a segment's header cannot be used.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum HeaderError {
    /// It does not check out: damage, told with where.
    Damaged(String),
    /// It checks out, in a format newer than this version reads: written
    /// by a newer version, and never damage to recover from.
    Newer(u32),
}

impl SegmentHeader {
    /// `[magic "LSEG"][format: u32][seq: u64][seed: u32][crc32 of the 20 bytes before]`,
    /// all little-endian.
    fn encode(&self) -> [u8; SEGMENT_HEADER] {
        let mut bytes = [0; SEGMENT_HEADER];
        bytes[0..4].copy_from_slice(SEGMENT_MAGIC);
        bytes[4..8].copy_from_slice(&self.format.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.seq.to_le_bytes());
        bytes[16..20].copy_from_slice(&self.seed.to_le_bytes());
        let crc = crc32fast::hash(&bytes[0..20]);
        bytes[20..24].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// The header at the start of `bytes`, or what is wrong with it.
    pub(super) fn decode(bytes: &[u8]) -> Result<SegmentHeader, HeaderError> {
        let damaged = |detail: String| Err(HeaderError::Damaged(detail));
        let Some(header) = bytes.get(..SEGMENT_HEADER) else {
            return damaged(format!(
                "{} bytes, shorter than a segment header",
                bytes.len()
            ));
        };
        if &header[0..4] != SEGMENT_MAGIC {
            return damaged("no segment header at byte 0".into());
        }
        if crc32fast::hash(&header[0..20]) != u32_at(header, 20) {
            return damaged("the segment header's checksum does not match (bytes 0..24)".into());
        }
        let format = u32_at(header, 4);
        if format > SEGMENT_FORMAT {
            return Err(HeaderError::Newer(format));
        }
        if format < OLDEST_SEGMENT_FORMAT {
            return damaged(format!(
                "segment format {format}, which no version wrote (the oldest is \
                 {OLDEST_SEGMENT_FORMAT})"
            ));
        }
        Ok(SegmentHeader {
            seq: u64::from_le_bytes(header[8..16].try_into().expect("8 bytes")),
            seed: u32_at(header, 16),
            format,
        })
    }
}

/// Encoded records not yet handed to [`Segment::commit`], laid out as
/// frames whose checksums the commit fills in (it knows the segment's seed).
#[derive(Debug, Default)]
pub(crate) struct LogBuffer {
    bytes: Vec<u8>,
    /// Where the frame records are appended to starts.
    open: Option<usize>,
    records: u64,
}

impl LogBuffer {
    /// Appends a record.
    pub(crate) fn push<R: serde::Serialize>(&mut self, record: &R) {
        match self.open {
            Some(start) if self.bytes.len() - start - FRAME_HEADER < FRAME_TARGET => {}
            _ => {
                self.close_frame();
                self.open = Some(self.bytes.len());
                self.bytes.extend_from_slice(&[0; FRAME_HEADER]);
            }
        }
        self.bytes = postcard::to_extend(record, std::mem::take(&mut self.bytes))
            .expect("log records always encode");
        self.records += 1;
    }

    /// Bytes laid out so far.
    pub(crate) fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Takes the frames (empty if no record was kept) and how many records
    /// they hold.
    pub(crate) fn take(&mut self) -> (Vec<u8>, u64) {
        self.close_frame();
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

    /// Writes the open frame's length, or drops the frame if it holds nothing.
    fn close_frame(&mut self) {
        if let Some(start) = self.open.take() {
            let len = self.bytes.len() - start - FRAME_HEADER;
            if len == 0 {
                self.bytes.truncate(start);
            } else {
                let len = u32::try_from(len).expect("a frame is far below 4 GiB");
                self.bytes[start..start + 4].copy_from_slice(&len.to_le_bytes());
            }
        }
    }
}

/// The frames of a [`LogBuffer::take`]: each one's range in the bytes.
fn frame_ranges(frames: &[u8]) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
    let mut at = 0;
    std::iter::from_fn(move || {
        (at < frames.len()).then(|| {
            let start = at;
            at += FRAME_HEADER + u32_at(frames, at) as usize;
            start..at
        })
    })
}

/// Fills in the checksums of a frame laid out by [`LogBuffer`].
fn seal(frame: &mut [u8], seed: u32) {
    let payload_crc = checksum(seed, &[&frame[FRAME_HEADER..]]);
    frame[4..8].copy_from_slice(&payload_crc.to_le_bytes());
    let header_crc = checksum(seed, &[&frame[..8]]);
    frame[8..12].copy_from_slice(&header_crc.to_le_bytes());
}

/// A record type of segments: how a frame's payload decodes in the format
/// its segment was written in.
pub(crate) trait SegmentRecord: Sized {
    fn decode_frame(format: u32, payload: &[u8]) -> Result<Vec<Self>, postcard::Error>;
}

/// The records of a frame's payload.
pub(super) fn decode_records<R: serde::de::DeserializeOwned>(
    mut payload: &[u8],
) -> Result<Vec<R>, postcard::Error> {
    let mut records = Vec::new();
    while !payload.is_empty() {
        let (record, rest) = postcard::take_from_bytes(payload)?;
        records.push(record);
        payload = rest;
    }
    Ok(records)
}

/// What the bytes at an offset of a segment are.
enum FrameAt<'a> {
    /// A frame whose checksums match: its payload.
    Valid(&'a [u8]),
    /// A zero length field or the end of the file: where frames stop.
    End,
    /// Not a valid frame, and why.
    Bad(String),
}

fn frame_at(bytes: &[u8], at: usize, seed: u32) -> FrameAt<'_> {
    let rest = &bytes[at.min(bytes.len())..];
    if rest.iter().take(4).all(|&b| b == 0) {
        return FrameAt::End;
    }
    if rest.len() < FRAME_HEADER {
        return FrameAt::Bad(format!(
            "a frame header cut short after {} bytes",
            rest.len()
        ));
    }
    if checksum(seed, &[&rest[..8]]) != u32_at(rest, 8) {
        return FrameAt::Bad("a frame header whose checksum does not match".into());
    }
    let len = u32_at(rest, 0) as usize;
    let Some(payload) = rest.get(FRAME_HEADER..FRAME_HEADER + len) else {
        return FrameAt::Bad(format!(
            "a frame of {len} bytes with only {} present",
            rest.len() - FRAME_HEADER
        ));
    };
    if checksum(seed, &[payload]) != u32_at(rest, 4) {
        return FrameAt::Bad("a frame whose checksum does not match its payload".into());
    }
    FrameAt::Valid(payload)
}

/// How a segment's valid frames end.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum End {
    /// Only zeros follow, up to the end of the file.
    Clean,
    /// What follows cannot be a frame, and no valid frame comes after it:
    /// what an interrupted last write leaves (or damage to the last frame,
    /// which looks the same).
    Torn {
        /// What is there.
        detail: String,
    },
    /// A bad frame (or zeros) with a valid frame after it: damage, since a
    /// crash can only tear the last write.
    Damaged {
        /// What is there.
        detail: String,
        /// Where the first valid frame after it starts.
        valid_at: usize,
    },
}

/// A segment read from its header to its end.
#[derive(Debug)]
pub(super) struct Scan<'a> {
    /// The valid frames before `end_at`: offset and payload.
    pub frames: Vec<(usize, &'a [u8])>,
    /// Where the valid frames end.
    pub end_at: usize,
    /// What comes after them.
    pub end: End,
}

/// Reads the frames of a segment (`bytes`, header included) up to the first
/// that is not valid, and says what follows: see the module docs' rules.
pub(super) fn scan(bytes: &[u8], seed: u32) -> Scan<'_> {
    let mut frames = Vec::new();
    let mut at = SEGMENT_HEADER;
    let bad = loop {
        match frame_at(bytes, at, seed) {
            FrameAt::Valid(payload) => {
                frames.push((at, payload));
                at += FRAME_HEADER + payload.len();
            }
            FrameAt::End => break None,
            FrameAt::Bad(detail) => break Some(detail),
        }
    };
    // Any valid frame further on was durable before the crash, which only
    // tears the last write: what stopped the scan is damage. The checksums
    // start from the segment's random seed, so bytes a client sent (a lock
    // name inside a record) cannot pass for a frame here.
    let later =
        (at + 1..bytes.len()).find(|&at| matches!(frame_at(bytes, at, seed), FrameAt::Valid(_)));
    let rest = &bytes[at.min(bytes.len())..];
    let end = match (bad, later) {
        (bad, Some(valid_at)) => End::Damaged {
            detail: bad.unwrap_or_else(|| "zeros".into()),
            valid_at,
        },
        (Some(detail), None) => End::Torn { detail },
        (None, None) if rest.iter().all(|&b| b == 0) => End::Clean,
        (None, None) => End::Torn {
            detail: "zeros, then bytes that are no frame".into(),
        },
    };
    Scan {
        frames,
        end_at: at,
        end,
    }
}

/// The log segment being appended to.
pub(super) struct Segment {
    file: File,
    path: PathBuf,
    /// A simulated disk's write-back cache, told of every frame written
    /// and every sync (`Environment::write_cache`).
    cache: Option<Arc<dyn WriteCache>>,
    seed: u32,
    /// End of its frames: where the next commit writes.
    end: u64,
    /// End of the zeros ahead of `end` (the file's length).
    zeroed: u64,
}

impl Segment {
    /// Creates segment `seq` with its header and a first chunk of zeros,
    /// durable with its directory entry; its frames go through `cache`.
    pub(super) fn create(
        dir: &Path,
        seq: u64,
        cache: Option<Arc<dyn WriteCache>>,
    ) -> io::Result<Segment> {
        let path = segment_path(dir, seq);
        let file = owner_only()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&path)?;
        let header = SegmentHeader {
            seq,
            seed: crate::random::u32(),
            format: SEGMENT_FORMAT,
        };
        file.write_all_at(&header.encode(), 0)?;
        let mut segment = Segment {
            file,
            path,
            cache,
            seed: header.seed,
            end: SEGMENT_HEADER as u64,
            zeroed: SEGMENT_HEADER as u64,
        };
        segment.add_zeros()?;
        sync_dir(dir)?;
        Ok(segment)
    }

    /// Bytes of the segment up to the end of its frames.
    pub(super) fn len(&self) -> u64 {
        self.end
    }

    /// Seals `frames` (from [`LogBuffer::take`]), writes them over the zeros
    /// ahead of the end and makes them durable: one `fdatasync`, or one per
    /// frame if there are several, so that a crash can only ever tear the
    /// last frame written.
    pub(super) fn commit(&mut self, frames: &mut [u8]) -> io::Result<()> {
        if self.write_frames(frames)? {
            self.sync()?;
        }
        Ok(())
    }

    /// The first half of [`Segment::commit`]: seals and writes `frames`,
    /// each but the last made durable before the next is written; the last
    /// is left for [`Segment::sync`]. Whether any frame was written.
    pub(super) fn write_frames(&mut self, frames: &mut [u8]) -> io::Result<bool> {
        let ranges: Vec<_> = frame_ranges(frames).collect();
        let written = !ranges.is_empty();
        for (i, range) in ranges.into_iter().enumerate() {
            if i > 0 {
                self.sync()?;
            }
            let frame = &mut frames[range];
            seal(frame, self.seed);
            if let Some(cache) = &self.cache {
                cache.writing(&self.path, self.end, frame.len() as u64);
            }
            self.file.write_all_at(frame, self.end)?;
            self.end += frame.len() as u64;
            self.zeroed = self.zeroed.max(self.end);
        }
        Ok(written)
    }

    /// Makes what was written durable: one `fdatasync`.
    pub(super) fn sync(&mut self) -> io::Result<()> {
        self.file.sync_data()?;
        if let Some(cache) = &self.cache {
            cache.synced(&self.path);
        }
        Ok(())
    }

    /// Keeps at least [`ZEROS_LOW_WATER`] bytes of zeros ahead of the end, so
    /// that commits overwrite blocks instead of growing the file.
    pub(super) fn keep_zeros_ahead(&mut self) -> io::Result<()> {
        if self.zeroed - self.end < ZEROS_LOW_WATER {
            self.add_zeros()?;
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::LogRecord;
    use locksmith_core::Command;
    use proptest::prelude::*;

    const SEED: u32 = 0x5eed_1234;

    fn record(name: &str) -> LogRecord {
        LogRecord {
            now: name.len() as u64,
            command: Command::ForceRelease { name: name.into() },
            secret: None,
            request: Some(7),
        }
    }

    /// A segment holding one frame per commit, then `zeros` zeros; and where
    /// each frame starts and ends.
    fn segment(commits: &[Vec<LogRecord>], zeros: usize) -> (Vec<u8>, Vec<(usize, usize)>) {
        segment_with_seed(commits, zeros, SEED)
    }

    fn segment_with_seed(
        commits: &[Vec<LogRecord>],
        zeros: usize,
        seed: u32,
    ) -> (Vec<u8>, Vec<(usize, usize)>) {
        let mut bytes = SegmentHeader {
            seq: 1,
            seed,
            format: SEGMENT_FORMAT,
        }
        .encode()
        .to_vec();
        let mut frames = Vec::new();
        let mut buffer = LogBuffer::default();
        for commit in commits {
            for r in commit {
                buffer.push(r);
            }
            let (mut taken, _) = buffer.take();
            for range in frame_ranges(&taken).collect::<Vec<_>>() {
                seal(&mut taken[range.clone()], seed);
                frames.push((bytes.len() + range.start, bytes.len() + range.end));
            }
            bytes.extend_from_slice(&taken);
        }
        bytes.resize(bytes.len() + zeros, 0);
        (bytes, frames)
    }

    fn records_of(scan: &Scan<'_>) -> Vec<LogRecord> {
        scan.frames
            .iter()
            .flat_map(|(_, payload)| decode_records(payload).unwrap())
            .collect()
    }

    /// Commits of 1–4 records with names of 1–300 letters: 6 to 40 of them
    /// (some segments above 8 KiB, for the zeroed blocks).
    fn commits() -> impl Strategy<Value = Vec<Vec<LogRecord>>> {
        let name = prop::collection::vec(b'a'..=b'z', 1..300);
        let record = name.prop_map(|name| record(std::str::from_utf8(&name).unwrap()));
        prop::collection::vec(prop::collection::vec(record, 1..=4), 6..40)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn an_intact_segment_reads_back_whole(commits in commits(), zeros in 0usize..5000) {
            let (bytes, frames) = segment(&commits, zeros);
            let scan = scan(&bytes, SEED);
            prop_assert_eq!(&scan.end, &End::Clean);
            prop_assert_eq!(scan.end_at, frames.last().unwrap().1);
            prop_assert_eq!(records_of(&scan), commits.concat());
        }

        /// A crash during the last commit leaves any subset of its 512-byte
        /// sectors written (the rest still the zeros written ahead), or a file
        /// cut short in it: never damage, and every earlier frame is there.
        #[test]
        fn a_torn_last_frame_is_never_damage(
            commits in commits(),
            zeros in 0usize..5000,
            written in prop::collection::vec(any::<bool>(), 64),
            cut in proptest::option::of(any::<prop::sample::Index>()),
        ) {
            let (mut bytes, frames) = segment(&commits, zeros);
            let (start, end) = *frames.last().unwrap();
            match cut {
                Some(cut) => bytes.truncate(start + 1 + cut.index(end - start - 1)),
                None => {
                    for (i, sector) in (start / 512..=(end - 1) / 512).enumerate() {
                        if !written[i % written.len()] {
                            let range = (sector * 512).max(start)..(sector * 512 + 512).min(end);
                            bytes[range].fill(0);
                        }
                    }
                }
            }
            let scan = scan(&bytes, SEED);
            prop_assert!(!matches!(scan.end, End::Damaged { .. }), "{:?}", scan.end);
            let records = records_of(&scan);
            let before = commits[..commits.len() - 1].concat();
            prop_assert!(records == before || records == commits.concat());
        }

        /// Bytes that are no frame after the last commit, in the zeros ahead.
        #[test]
        fn garbage_in_the_zeros_is_a_torn_tail(
            commits in commits(),
            at in 0usize..4000,
            garbage in prop::collection::vec(1u8.., 1..64),
        ) {
            let (mut bytes, frames) = segment(&commits, 5000);
            let end = frames.last().unwrap().1;
            bytes[end + at..end + at + garbage.len()].copy_from_slice(&garbage);
            let scan = scan(&bytes, SEED);
            prop_assert!(matches!(scan.end, End::Torn { .. }), "{:?}", scan.end);
            prop_assert_eq!(scan.end_at, end);
            prop_assert_eq!(records_of(&scan), commits.concat());
        }

        /// A flipped bit or a wrong length in any frame but the last: damage,
        /// found at that frame, with the next frame named as valid.
        #[test]
        fn a_damaged_frame_before_valid_ones_is_damage(
            commits in commits(),
            which in any::<prop::sample::Index>(),
            bit in any::<prop::sample::Index>(),
            length in proptest::option::of(1u32..),
        ) {
            let (mut bytes, frames) = segment(&commits, 1000);
            let i = which.index(frames.len() - 1);
            let (start, end) = frames[i];
            match length {
                Some(len) => {
                    prop_assume!(len as usize != end - start - FRAME_HEADER);
                    bytes[start..start + 4].copy_from_slice(&len.to_le_bytes());
                }
                None => {
                    let bit = bit.index((end - start) * 8);
                    bytes[start + bit / 8] ^= 1 << (bit % 8);
                }
            }
            let scan = scan(&bytes, SEED);
            prop_assert_eq!(scan.end_at, start);
            prop_assert!(
                matches!(scan.end, End::Damaged { valid_at, .. } if valid_at == end),
                "{:?}", scan.end
            );
            prop_assert_eq!(scan.frames.len(), i);
        }

        /// A zeroed 4 KiB block with frames after it.
        #[test]
        fn a_zeroed_block_before_valid_frames_is_damage(
            commits in commits(),
            block in any::<prop::sample::Index>(),
        ) {
            let (mut bytes, frames) = segment(&commits, 1000);
            let last_start = frames.last().unwrap().0;
            prop_assume!(last_start >= 4096 * 2);
            let block = block.index(last_start / 4096 - 1) * 4096;
            bytes[block..block + 4096].fill(0);
            let hit = frames.iter().position(|&(_, end)| end > block).unwrap();
            let next = frames.iter().find(|&&(start, _)| start >= block + 4096).unwrap();
            let scan = scan(&bytes, SEED);
            prop_assert_eq!(scan.frames.len(), hit);
            prop_assert!(
                matches!(scan.end, End::Damaged { valid_at, .. } if valid_at == next.0),
                "{:?}", scan.end
            );
        }
    }

    #[test]
    fn a_frame_a_client_forged_in_a_lock_name_is_no_frame() {
        // A lock name that is a whole frame, checksums included (found by
        // trying names until its bytes are UTF-8), built with a guessed seed.
        let guess = 77;
        let forged = (0u64..)
            .find_map(|n| {
                let (bytes, _) = segment_with_seed(&[vec![record(&format!("f{n}"))]], 0, guess);
                String::from_utf8(bytes[SEGMENT_HEADER..].to_vec()).ok()
            })
            .unwrap();
        // The last commit holds it and is torn: its header never got written.
        let commits = [vec![record("a")], vec![record(&forged)]];
        let torn = |seed| {
            let (mut bytes, frames) = segment_with_seed(&commits, 100, seed);
            let (start, _) = frames[1];
            bytes[start..start + FRAME_HEADER].fill(0);
            bytes
        };
        // In a segment whose seed the client guessed right, it would pass for
        // a frame after the torn one, and the tear for damage.
        let bytes = torn(guess);
        assert!(matches!(scan(&bytes, guess).end, End::Damaged { .. }));
        // With any other seed it is what it is: bytes of a torn write.
        let bytes = torn(SEED);
        let scan = scan(&bytes, SEED);
        assert!(matches!(scan.end, End::Torn { .. }), "{:?}", scan.end);
        assert_eq!(records_of(&scan), [record("a")]);
    }

    #[test]
    fn a_large_commit_is_written_as_several_frames() {
        let name = "n".repeat(200);
        let commit: Vec<_> = (0..2 * FRAME_TARGET / 200).map(|_| record(&name)).collect();
        let (bytes, frames) = segment(std::slice::from_ref(&commit), 0);
        assert_eq!(frames.len(), 3);
        let scan = scan(&bytes, SEED);
        assert_eq!(scan.end, End::Clean);
        assert_eq!(records_of(&scan), commit);
    }

    #[test]
    fn the_segment_header_is_checked() {
        let header = SegmentHeader {
            seq: 42,
            seed: 9,
            format: SEGMENT_FORMAT,
        };
        let mut bytes = header.encode().to_vec();
        assert_eq!(SegmentHeader::decode(&bytes), Ok(header));
        let damaged = |bytes: &[u8]| match SegmentHeader::decode(bytes) {
            Err(HeaderError::Damaged(detail)) => detail,
            other => panic!("{other:?}"),
        };
        // A newer format, checksummed as that version writes it: told apart
        // from damage.
        let newer = SegmentHeader {
            format: SEGMENT_FORMAT + 1,
            ..header
        };
        assert_eq!(
            SegmentHeader::decode(&newer.encode()),
            Err(HeaderError::Newer(SEGMENT_FORMAT + 1))
        );
        bytes[9] ^= 1;
        assert!(damaged(&bytes).contains("checksum"));
        damaged(&bytes[..10]);
        damaged(&[0; 64]);
    }
}
