//! A shared-memory image of one parameter server's state.
//!
//! When a PS process dies but its host survives (OOM kill, crash, rolling restart), the
//! relaunched PS can reload its shard from memory in a fraction of the time a read from
//! checkpoint storage takes (DLRover-RM's flash checkpoint). The image is a file under
//! `/dev/shm` (POSIX shared memory on Linux: RAM-backed, survives the process, not the
//! host); where `/dev/shm` does not exist it falls back to the temp directory, which is
//! slower but keeps the same semantics.
//!
//! File format (little endian): a 40-byte header — magic `ELRSHMIM`, format version (u32),
//! reserved (u32), checkpoint id (u64), body length (u64), xxh3 checksum (u64) — then the
//! body. The checksum covers the id, the length and the body, so a damaged header is caught
//! as surely as a damaged body. Writes go to a temporary file in the same directory and are
//! renamed over the image, so a reader sees the old image or the new one, never a mix.

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Check, CheckpointError, Result};
use crate::format::CheckpointId;

const MAGIC: &[u8; 8] = b"ELRSHMIM";
const VERSION: u32 = 1;
const HEADER_LEN: usize = 40;

/// Distinguishes temporary files of concurrent writers in one process.
static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The shared-memory image of one named state (e.g. one PS shard) within a namespace
/// (e.g. one job).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShmImage {
    path: PathBuf,
}

impl ShmImage {
    /// The image `<name>.img` of `namespace` under `/dev/shm/elastrec` (or the temp
    /// directory without `/dev/shm`). Characters outside `[A-Za-z0-9_.-]` become `_`, so
    /// neither part can leave the directory.
    pub fn new(namespace: &str, name: &str) -> Self {
        Self::in_root(&default_root(), namespace, name)
    }

    /// The same image under another root directory (tests, hosts that mount shared memory
    /// elsewhere).
    pub fn in_root(root: &Path, namespace: &str, name: &str) -> Self {
        let file = format!("{}.img", sanitize(name));
        Self {
            path: root.join(sanitize(namespace)).join(file),
        }
    }

    /// The image file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Replaces the image with `bytes`, the state as of checkpoint `id`, atomically.
    pub fn write(&self, id: CheckpointId, bytes: &[u8]) -> Result<()> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|e| CheckpointError::io(dir, e))?;
        let tmp = self.tmp_path();
        let written = write_file(&tmp, id, bytes).and_then(|()| {
            std::fs::rename(&tmp, &self.path).map_err(|e| CheckpointError::io(&self.path, e))
        });
        if written.is_err() {
            // Best effort: a stale temporary file only wastes memory until the next write.
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }

    /// The image's checkpoint id and bytes; `None` when there is no image.
    /// [`CheckpointError::Corrupt`] or [`CheckpointError::BadImage`] when it must not be used.
    pub fn read(&self) -> Result<Option<(CheckpointId, Vec<u8>)>> {
        let mut file = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(CheckpointError::io(&self.path, e)),
        };
        let file_len = file
            .metadata()
            .map_err(|e| CheckpointError::io(&self.path, e))?
            .len();
        let header = self.read_header(&mut file)?;
        let body_len = file_len.saturating_sub(HEADER_LEN as u64);
        if body_len != header.len {
            return Err(self.corrupt(header.id, Check::Size, header.len, body_len));
        }
        let capacity = usize::try_from(body_len).map_err(|_| self.bad("image too large"))?;
        let mut body = Vec::with_capacity(capacity);
        file.read_to_end(&mut body)
            .map_err(|e| CheckpointError::io(&self.path, e))?;
        let found = image_checksum(header.id, &body);
        if found != header.checksum {
            return Err(self.corrupt(header.id, Check::Checksum, header.checksum, found));
        }
        Ok(Some((header.id, body)))
    }

    /// Deletes the image (no error when there is none), freeing its memory.
    pub fn remove(&self) -> Result<()> {
        match std::fs::remove_file(&self.path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(CheckpointError::io(&self.path, e)),
        }
    }

    fn tmp_path(&self) -> PathBuf {
        let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let mut name = self.path.file_name().unwrap_or_default().to_os_string();
        name.push(format!(".tmp-{}-{n}", std::process::id()));
        self.path.with_file_name(name)
    }

    fn read_header(&self, file: &mut File) -> Result<Header> {
        let mut raw = [0u8; HEADER_LEN];
        file.read_exact(&mut raw).map_err(|e| match e.kind() {
            ErrorKind::UnexpectedEof => self.bad("shorter than its header"),
            _ => CheckpointError::io(&self.path, e),
        })?;
        let header = Header::decode(&raw);
        if &header.magic != MAGIC {
            return Err(self.bad("not an elastrec image (bad magic)"));
        }
        if header.version != VERSION {
            return Err(self.bad(&format!(
                "format version {} (this build reads {VERSION})",
                header.version
            )));
        }
        Ok(header)
    }

    fn bad(&self, reason: &str) -> CheckpointError {
        CheckpointError::BadImage {
            path: self.path.clone(),
            reason: reason.to_string(),
        }
    }

    fn corrupt(
        &self,
        id: CheckpointId,
        check: Check,
        expected: u64,
        found: u64,
    ) -> CheckpointError {
        let part = self
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        CheckpointError::Corrupt {
            id,
            part,
            location: self.path.display().to_string(),
            check,
            expected,
            found,
        }
    }
}

/// The fixed-size header in front of an image.
struct Header {
    magic: [u8; 8],
    version: u32,
    id: CheckpointId,
    len: u64,
    checksum: u64,
}

impl Header {
    fn encode(&self) -> [u8; HEADER_LEN] {
        let mut raw = [0u8; HEADER_LEN];
        raw[0..8].copy_from_slice(&self.magic);
        raw[8..12].copy_from_slice(&self.version.to_le_bytes());
        // 12..16 reserved, zero.
        raw[16..24].copy_from_slice(&self.id.to_le_bytes());
        raw[24..32].copy_from_slice(&self.len.to_le_bytes());
        raw[32..40].copy_from_slice(&self.checksum.to_le_bytes());
        raw
    }

    fn decode(raw: &[u8; HEADER_LEN]) -> Self {
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&raw[at..at + 8]);
            u64::from_le_bytes(b)
        };
        let mut magic = [0u8; 8];
        magic.copy_from_slice(&raw[0..8]);
        let mut version = [0u8; 4];
        version.copy_from_slice(&raw[8..12]);
        Self {
            magic,
            version: u32::from_le_bytes(version),
            id: u64_at(16),
            len: u64_at(24),
            checksum: u64_at(32),
        }
    }
}

/// xxh3 over id, length and body.
fn image_checksum(id: CheckpointId, body: &[u8]) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&id.to_le_bytes());
    h.update(&(body.len() as u64).to_le_bytes());
    h.update(body);
    h.digest()
}

/// Writes a complete image to `path`. No fsync: shared memory does not survive a reboot
/// anyway, and the rename already protects readers from a writer that dies half way.
fn write_file(path: &Path, id: CheckpointId, bytes: &[u8]) -> Result<()> {
    let header = Header {
        magic: *MAGIC,
        version: VERSION,
        id,
        len: bytes.len() as u64,
        checksum: image_checksum(id, bytes),
    };
    let mut file = File::create(path).map_err(|e| CheckpointError::io(path, e))?;
    file.write_all(&header.encode())
        .and_then(|()| file.write_all(bytes))
        .map_err(|e| CheckpointError::io(path, e))
}

/// `/dev/shm/elastrec` on Linux, `<temp dir>/elastrec` elsewhere.
fn default_root() -> PathBuf {
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    base.join("elastrec")
}

/// Keeps `[A-Za-z0-9_.-]`, replaces the rest with `_`; a name of only dots (or nothing)
/// gets a leading `_` so it cannot mean "this" or "parent" directory.
fn sanitize(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| match c {
            'A'..='Z' | 'a'..='z' | '0'..='9' | '_' | '.' | '-' => c,
            _ => '_',
        })
        .collect();
    if out.chars().all(|c| c == '.') {
        out.insert(0, '_');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitize_keeps_paths_inside() {
        assert_eq!(sanitize("job-1.ps_0"), "job-1.ps_0");
        assert_eq!(sanitize("../etc/passwd"), ".._etc_passwd");
        assert_eq!(sanitize(".."), "_..");
        assert_eq!(sanitize(""), "_");
        assert_eq!(sanitize("a b/c"), "a_b_c");
    }

    #[test]
    fn header_round_trips() {
        let h = Header {
            magic: *MAGIC,
            version: VERSION,
            id: 42,
            len: 7,
            checksum: 0xdead_beef,
        };
        let back = Header::decode(&h.encode());
        assert_eq!(
            (back.magic, back.version, back.id, back.len, back.checksum),
            (*MAGIC, VERSION, 42, 7, 0xdead_beef)
        );
    }

    #[test]
    fn image_path_is_sanitized() {
        let img = ShmImage::in_root(Path::new("/r"), "job/1", "../ps 0");
        assert_eq!(img.path(), Path::new("/r/job_1/.._ps_0.img"));
    }
}
