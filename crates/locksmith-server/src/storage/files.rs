//! The data directory's files as files: owner-only modes, the `flock`, files
//! replaced atomically and checked on reading (the manifest and the
//! snapshot), the list of segments, the copy a forced recovery keeps, and
//! the temporary directory of a server started without a data directory.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::ServerError;

/// Format of the checked files' framing.
const CHECKED_FORMAT: u32 = 1;
/// Bytes before a checked file's payload: magic, format, length, CRC-32.
pub(super) const CHECKED_HEADER: usize = 20;

/// Options that create a file readable and writable by its owner only (mode
/// 0600, before the umask): the log and snapshots hold session secrets.
pub(super) fn owner_only() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.mode(0o600);
    options
}

/// Creates `dir` (mode 0700) if needed, and takes away any access other users
/// have to an existing one and to the files in it (an earlier release made
/// them 0755 and 0644).
pub(super) fn make_owner_only(dir: &Path) -> Result<(), ServerError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| io_error("cannot create", dir, e))?;
    let restrict = |path: &Path, mode: u32| -> Result<Option<u32>, ServerError> {
        let old = fs::metadata(path)
            .map_err(|e| io_error("cannot inspect", path, e))?
            .permissions()
            .mode();
        if old & 0o077 == 0 {
            return Ok(None);
        }
        fs::set_permissions(path, fs::Permissions::from_mode(mode))
            .map_err(|e| io_error("cannot restrict the mode of", path, e))?;
        Ok(Some(old & 0o777))
    };
    if let Some(old) = restrict(dir, 0o700)? {
        tracing::warn!(
            data_dir = %dir.display(), old_mode = format!("{old:o}"),
            "the data directory was open to other users: made owner-only (700)"
        );
    }
    for entry in fs::read_dir(dir).map_err(|e| io_error("cannot list", dir, e))? {
        let path = entry.map_err(|e| io_error("cannot list", dir, e))?.path();
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

/// Takes an exclusive `flock` on `dir/LOCK`, failing if another server holds it.
pub(super) fn lock_dir(dir: &Path) -> Result<File, ServerError> {
    let path = dir.join("LOCK");
    let file = owner_only()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| io_error("cannot open", &path, e))?;
    // SAFETY: flock(2) on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let error = io::Error::last_os_error();
        return Err(if error.kind() == io::ErrorKind::WouldBlock {
            ServerError::DataDirInUse(dir.to_owned())
        } else {
            io_error("cannot lock", &path, error)
        });
    }
    Ok(file)
}

/// Whether `dir` is on a filesystem kept in memory (tmpfs, as `/dev/shm`
/// where a server without a data directory keeps its Raft log, or ramfs):
/// there a write is a copy into memory and `fdatasync` returns at once.
/// False when it cannot tell.
pub(super) fn on_memory_filesystem(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statfs(2) fills the struct it is given (all zeros is a valid
    // value of it) from a NUL-terminated path that outlives the call.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(path.as_ptr(), &mut stat) } != 0 {
        return false;
    }
    /// ramfs's magic number (linux/magic.h), which the libc crate lacks.
    const RAMFS_MAGIC: libc::c_long = 0x8584_58f6;
    matches!(stat.f_type, libc::TMPFS_MAGIC | RAMFS_MAGIC)
}

/// The directory of a server without a data directory (its Raft log), locked
/// like a data directory while the server runs and removed when it stops.
pub(crate) struct TemporaryDir {
    dir: tempfile::TempDir,
    _lock: File,
}

/// How old a temporary directory nobody holds must be before a start removes
/// it: a younger one may belong to a server that has not locked it yet.
const ORPHAN_AGE: Duration = Duration::from_secs(60);

impl TemporaryDir {
    /// Creates and locks `parent/<prefix>XXXXXX`. First removes the
    /// directories with that prefix that no running server holds: a server
    /// killed before it stopped left its own behind, and on `/dev/shm` each
    /// one is memory kept until the machine restarts.
    pub(crate) fn create(parent: &Path, prefix: &str) -> Result<TemporaryDir, ServerError> {
        remove_orphans(parent, prefix);
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in(parent)
            .map_err(|e| io_error("cannot create a temporary directory in", parent, e))?;
        let lock = lock_dir(dir.path())?;
        Ok(TemporaryDir { dir, _lock: lock })
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Removes the directories `parent/<prefix>*` older than [`ORPHAN_AGE`] whose
/// lock nobody holds. One without a `LOCK` file stays: an earlier version's
/// server did not lock its directory, and may still be running. Best effort:
/// what cannot be read or removed stays.
fn remove_orphans(parent: &Path, prefix: &str) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let ours = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(prefix));
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|age| age >= ORPHAN_AGE));
        if !(ours && old && path.join("LOCK").is_file()) {
            continue;
        }
        if let Ok(_lock) = lock_dir(&path) {
            tracing::info!(dir = %path.display(), "removing the directory of a server that has ended");
            let _ = fs::remove_dir_all(&path);
        }
    }
}

pub(super) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Replaces `dir/name` with `bytes`, atomically and durably: written to
/// `name.tmp`, fsynced, renamed over `name`, and the directory fsynced. A
/// crash leaves either the old file or the new one, never half of one.
pub(super) fn replace_durably(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    Staged::write(dir, name, bytes)?.replace()
}

/// Bytes of a big file made durable at a time, each step before the next is
/// written. A disk's flush carries every write before it: a backup or
/// snapshot of 64 MB written whole, or only handed to the kernel's
/// write-back in steps (`sync_file_range`, as before), sat in the disk's
/// cache (on a VM, its host's) until a flush, and the next sync of the Raft
/// log on that disk waited for all of it. Synced in steps, the log's sync
/// waits for at most one: with a megabyte, a group of one's handoff p99
/// during a save to its own disk was 3.5-5.6x that without; with 256 KiB,
/// 1.9-2.2x, the save as quick (docs/BENCHMARKS.md, "A backup made durable
/// a megabyte at a time" and "Smaller synced steps").
const SYNC_STEP: usize = 256 << 10;

/// The new content of `dir/name`, written and fsynced as `name.tmp`: put in
/// place by [`Staged::replace`], removed if dropped before. Writing it can
/// go on while another thread decides whether it should replace the file.
pub(super) struct Staged {
    dir: PathBuf,
    name: String,
    /// Until replaced.
    tmp: Option<PathBuf>,
}

impl Staged {
    /// Writes and fsyncs `dir/name.tmp`.
    pub(super) fn write(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<Staged> {
        let mut staging = Staging::create(dir, name)?;
        staging.append(bytes)?;
        Ok(staging.finish()?.0)
    }

    /// Renames it over `dir/name` and fsyncs the directory.
    pub(super) fn replace(mut self) -> io::Result<()> {
        let tmp = self.tmp.take().expect("replaced once");
        fs::rename(&tmp, self.dir.join(&self.name))?;
        sync_dir(&self.dir)
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Some(tmp) = self.tmp.take() {
            let _ = fs::remove_file(tmp);
        }
    }
}

/// A [`Staged`] file written as its bytes come, a [`SYNC_STEP`] made
/// durable before the next is written.
pub(super) struct Staging {
    staged: Staged,
    file: File,
    /// Bytes written since the last sync.
    unsynced: usize,
}

impl Staging {
    /// Creates (or empties) `dir/name.tmp`, owner-only, readable as well
    /// (to map it once written: [`Staging::finish`]).
    pub(super) fn create(dir: &Path, name: &str) -> io::Result<Staging> {
        let tmp = dir.join(format!("{name}.tmp"));
        let staged = Staged {
            dir: dir.to_owned(),
            name: name.to_owned(),
            tmp: Some(tmp.clone()),
        };
        let file = owner_only()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        Ok(Staging {
            staged,
            file,
            unsynced: 0,
        })
    }

    /// Appends `bytes`, syncing at each [`SYNC_STEP`] written.
    pub(super) fn append(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            let now = bytes.len().min(SYNC_STEP - self.unsynced);
            self.file.write_all(&bytes[..now])?;
            self.unsynced += now;
            bytes = &bytes[now..];
            if self.unsynced == SYNC_STEP {
                self.file.sync_data()?;
                self.unsynced = 0;
            }
        }
        Ok(())
    }

    /// Makes it all durable (`fsync`): the staged file, and the open file
    /// to read it back from.
    pub(super) fn finish(self) -> io::Result<(Staged, File)> {
        self.file.sync_all()?;
        Ok((self.staged, self.file))
    }
}

/// `payload` framed as a checked file: `[magic][format: u32 LE][len: u64 LE]
/// [crc32: u32 LE][payload]`.
pub(super) fn checked(magic: &[u8; 4], payload: &[u8]) -> Vec<u8> {
    let mut bytes = checked_buffer(payload.len());
    bytes.extend_from_slice(payload);
    seal(magic, bytes)
}

/// The start of a checked file whose payload is then appended in place
/// (room for `payload` bytes): the header's room, filled by [`seal`].
pub(super) fn checked_buffer(payload: usize) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(CHECKED_HEADER + payload);
    bytes.resize(CHECKED_HEADER, 0);
    bytes
}

/// Fills in the header of `bytes`, a [`checked_buffer`] with its payload
/// appended.
pub(super) fn seal(magic: &[u8; 4], mut bytes: Vec<u8>) -> Vec<u8> {
    seal_in_place(magic, &mut bytes);
    bytes
}

/// Fills in the header of `bytes`: a checked file, its header's room
/// first, then its payload.
pub(super) fn seal_in_place(magic: &[u8; 4], bytes: &mut [u8]) {
    let (header, payload) = bytes.split_at_mut(CHECKED_HEADER);
    header[0..4].copy_from_slice(magic);
    header[4..8].copy_from_slice(&CHECKED_FORMAT.to_le_bytes());
    header[8..16].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    header[16..20].copy_from_slice(&crc32fast::hash(payload).to_le_bytes());
}

/// The payload of the checked file at `path` (`None` if there is no such
/// file), or why it cannot be trusted.
pub(super) fn read_checked(path: &Path, magic: &[u8; 4]) -> Result<Option<Vec<u8>>, ServerError> {
    let mut bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error("cannot read", path, e)),
    };
    let len = unframe(path, &bytes, magic)?.len();
    // The payload moved to the front of the buffer it was read into: a
    // snapshot of a million locks is 64 MB, which a copy would allocate
    // (and the kernel zero) again.
    bytes.copy_within(CHECKED_HEADER..CHECKED_HEADER + len, 0);
    bytes.truncate(len);
    Ok(Some(bytes))
}

/// The payload of `bytes`, a checked file (named `path` in errors), or why
/// it cannot be trusted. A framing format newer than this server's is
/// refused as written by a newer version.
pub(super) fn unframe<'a>(
    path: &Path,
    bytes: &'a [u8],
    magic: &[u8; 4],
) -> Result<&'a [u8], ServerError> {
    let corrupt = |detail: String| ServerError::Corrupt {
        path: path.to_owned(),
        detail,
    };
    if bytes.len() < CHECKED_HEADER || &bytes[0..4] != magic {
        return Err(corrupt(format!(
            "not a locksmith {} file (byte 0)",
            String::from_utf8_lossy(magic)
        )));
    }
    let format = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
    if format > CHECKED_FORMAT {
        return Err(ServerError::Incompatible {
            path: path.to_owned(),
            detail: format!(
                "framing format {format} (byte 4), written by a newer version: this one reads \
                 format {CHECKED_FORMAT}; run the newer version, or restore from a backup it can read"
            ),
        });
    }
    if format != CHECKED_FORMAT {
        return Err(corrupt(format!(
            "format {format} (byte 4), this server reads {CHECKED_FORMAT}"
        )));
    }
    let len = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    let crc = u32::from_le_bytes(bytes[16..20].try_into().expect("4 bytes"));
    let payload = usize::try_from(len)
        .ok()
        .and_then(|len| CHECKED_HEADER.checked_add(len))
        .and_then(|end| bytes.get(CHECKED_HEADER..end))
        .ok_or_else(|| {
            corrupt(format!(
                "{len} bytes announced at byte 8, {} present",
                bytes.len() - CHECKED_HEADER
            ))
        })?;
    if crc32fast::hash(payload) != crc {
        return Err(corrupt(format!(
            "checksum mismatch over bytes {CHECKED_HEADER}..{}",
            CHECKED_HEADER + payload.len()
        )));
    }
    Ok(payload)
}

pub(super) fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("log-{seq:020}"))
}

/// The numbers of the segments in `dir`, in order.
pub(super) fn list_segments(dir: &Path) -> Result<Vec<u64>, ServerError> {
    let entries = fs::read_dir(dir).map_err(|e| io_error("cannot list", dir, e))?;
    let mut segments: Vec<u64> = entries
        .filter_map(|entry| {
            let name = entry.ok()?.file_name();
            name.to_str()?.strip_prefix("log-")?.parse().ok()
        })
        .collect();
    segments.sort_unstable();
    Ok(segments)
}

/// Hard-links every file of `dir` (but `LOCK`) into a new `damaged-<unix
/// time>` directory in it: the files exactly as a forced recovery found them,
/// kept for inspection whatever the recovery then replaces or deletes.
pub(super) fn keep_evidence(dir: &Path) -> Result<PathBuf, ServerError> {
    let seconds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut evidence = dir.join(format!("damaged-{seconds}"));
    let mut n = 1;
    while evidence.exists() {
        n += 1;
        evidence = dir.join(format!("damaged-{seconds}-{n}"));
    }
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&evidence)
        .map_err(|e| io_error("cannot create", &evidence, e))?;
    link_files(dir, &evidence)?;
    sync_dir(dir).map_err(|e| io_error("cannot sync", dir, e))?;
    Ok(evidence)
}

/// Hard-links the files of `from` (and of its subdirectories, but earlier
/// evidence) into `to`, keeping their relative paths.
fn link_files(from: &Path, to: &Path) -> Result<(), ServerError> {
    for entry in fs::read_dir(from).map_err(|e| io_error("cannot list", from, e))? {
        let entry = entry.map_err(|e| io_error("cannot list", from, e))?;
        let (path, name) = (entry.path(), entry.file_name());
        if path.is_file() && name != "LOCK" {
            fs::hard_link(&path, to.join(&name))
                .map_err(|e| io_error("cannot keep a link to", &path, e))?;
        } else if path.is_dir() && !name.to_string_lossy().starts_with("damaged-") {
            let sub = to.join(&name);
            fs::DirBuilder::new()
                .mode(0o700)
                .create(&sub)
                .map_err(|e| io_error("cannot create", &sub, e))?;
            link_files(&path, &sub)?;
        }
    }
    sync_dir(to).map_err(|e| io_error("cannot sync", to, e))
}

pub(crate) fn io_error(what: &str, path: &Path, source: io::Error) -> ServerError {
    ServerError::Io {
        context: format!("{what} {}", path.display()),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Makes `dir` look as if it was last changed long ago.
    fn age(dir: &Path) {
        let long_ago = SystemTime::now() - 2 * ORPHAN_AGE;
        File::open(dir).unwrap().set_modified(long_ago).unwrap();
    }

    #[test]
    fn a_file_written_in_synced_steps_is_written_whole() {
        let dir = tempfile::tempdir().unwrap();
        // Two steps and a part of a third.
        let bytes: Vec<u8> = (0..2 * SYNC_STEP + 12_345)
            .map(|i| (i % 251) as u8)
            .collect();
        replace_durably(dir.path(), "big", &bytes).unwrap();
        assert!(fs::read(dir.path().join("big")).unwrap() == bytes);
        assert!(!dir.path().join("big.tmp").exists());

        // Staged as parts come, parts that end before, on and across a
        // step's end: the same bytes, in order.
        let mut staging = Staging::create(dir.path(), "parts").unwrap();
        for part in bytes.chunks(SYNC_STEP / 3 + 7) {
            staging.append(part).unwrap();
        }
        let (staged, _file) = staging.finish().unwrap();
        assert!(fs::read(dir.path().join("parts.tmp")).unwrap() == bytes);
        staged.replace().unwrap();
        assert!(fs::read(dir.path().join("parts")).unwrap() == bytes);
        assert!(!dir.path().join("parts.tmp").exists());
    }

    /// `/dev/shm` is tmpfs on Linux; the project's own directory is on a
    /// disk (or an overlay of one).
    #[test]
    fn a_memory_filesystem_is_told_from_a_disk() {
        let shm = tempfile::tempdir_in("/dev/shm").unwrap();
        assert!(on_memory_filesystem(shm.path()));
        assert!(!on_memory_filesystem(Path::new(env!("CARGO_MANIFEST_DIR"))));
        assert!(!on_memory_filesystem(Path::new("/no/such/directory")));
    }

    #[test]
    fn a_start_removes_the_temporary_directories_of_servers_that_ended() {
        let parent = tempfile::tempdir().unwrap();
        let prefix = "locksmith-raft-";
        let orphan = parent.path().join(format!("{prefix}killed"));
        fs::create_dir(&orphan).unwrap();
        fs::write(orphan.join("log-1"), b"entries").unwrap();
        fs::write(orphan.join("LOCK"), b"").unwrap();
        age(&orphan);
        let unlocked = parent.path().join(format!("{prefix}earlier-version"));
        fs::create_dir(&unlocked).unwrap();
        age(&unlocked);
        let young = parent.path().join(format!("{prefix}starting"));
        fs::create_dir(&young).unwrap();
        let other = parent.path().join("someone-else");
        fs::create_dir(&other).unwrap();
        age(&other);
        let running = TemporaryDir::create(parent.path(), prefix).unwrap();
        age(running.path());
        assert!(!orphan.exists(), "a directory nobody holds is removed");

        let second = TemporaryDir::create(parent.path(), prefix).unwrap();
        assert!(
            running.path().exists(),
            "a running server's directory stays"
        );
        assert!(
            young.exists(),
            "a directory just made may not be locked yet"
        );
        assert!(
            unlocked.exists(),
            "a server that does not lock may still run"
        );
        assert!(
            other.exists(),
            "only directories with the prefix are looked at"
        );

        let gone = second.path().to_owned();
        drop(second);
        assert!(!gone.exists(), "a server that stops removes its own");
    }
}
