//! A shared-memory image of one parameter server's state.
//!
//! When a PS process dies but its host survives (OOM kill, crash, rolling restart), the
//! relaunched PS can reload its shard from memory in a fraction of the time a read from
//! checkpoint storage takes (DLRover-RM's flash checkpoint). The image is a file under
//! `/dev/shm` (POSIX shared memory on Linux: RAM-backed, survives the process, not the
//! host); where `/dev/shm` does not exist it falls back to the temp directory, which is
//! slower but keeps the same semantics.
//!
//! **Privacy.** `/dev/shm` is writable by every user of the host, and an image is a copy of
//! the model. Images therefore live under a per-user root, `/dev/shm/elastrec-<uid>` (or
//! `$ELASTREC_SHM_ROOT`), which is created with mode 0700 and checked whenever it is opened:
//! a real directory, not a symbolic link, owned by this user, mode 0700. Anything else is
//! refused ([`CheckpointError::ShmUnsafe`]) rather than repaired, because a directory that
//! another user created or can enter lets that user read the model, plant an image, or
//! plant a link that makes us overwrite one of our own files. Namespace directories are
//! 0700 as well and images 0600.
//!
//! **Writes.** An image is written to a new temporary file in the same directory, created
//! exclusively (`O_CREAT|O_EXCL|O_NOFOLLOW`, so neither an existing file nor a link is ever
//! opened) and renamed over the image, so a reader sees the old image or the new one, never
//! a mix, and a link planted at the image's name is replaced, not followed. A write that
//! fails (`ENOSPC` from a full `/dev/shm`, or any other I/O error) removes its temporary
//! file and returns [`CheckpointError::ShmWrite`]: the image only speeds up a restart on this
//! host, so the caller persists the checkpoint to storage only.
//!
//! **Names.** A namespace (one per job) and an image name are opaque strings of
//! `[A-Za-z0-9._-]`, checked rather than rewritten ([`validate_namespace`]): a rewrite could
//! map two namespaces to one directory, whose jobs would then read and remove each other's
//! images. They are file names, so callers must not put secrets in them.
//!
//! File format (little endian): a 40-byte header — magic `ELRSHMIM`, format version (u32),
//! reserved (u32), checkpoint id (u64), body length (u64), xxh3 checksum (u64) — then the
//! body. The checksum covers the id, the length and the body, so a damaged header is caught
//! as surely as a damaged body.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Check, CheckpointError, Result};
use crate::format::CheckpointId;

/// Environment variable naming the root directory of the images instead of
/// `/dev/shm/elastrec-<uid>` (hosts that mount shared memory elsewhere, tests). The
/// directory gets the same checks as the default one.
pub const SHM_ROOT_ENV: &str = "ELASTREC_SHM_ROOT";

/// Longest namespace or image name, in bytes. The temporary file name adds about 40 bytes
/// to the image name and file names are limited to 255.
pub const MAX_NAME_LEN: usize = 128;

const MAGIC: &[u8; 8] = b"ELRSHMIM";
const VERSION: u32 = 1;
const HEADER_LEN: usize = 40;

/// Mode of the root and namespace directories: only this user may list or enter them.
const PRIVATE_DIR_MODE: u32 = 0o700;

/// Mode of image files: only this user may read them.
const IMAGE_MODE: u32 = 0o600;

/// Distinguishes temporary files of concurrent writers in one process.
static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// This user's directory of shared-memory images, checked to be private when opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShmRoot {
    dir: PathBuf,
}

impl ShmRoot {
    /// The root of this process: `$ELASTREC_SHM_ROOT` when set and not empty, otherwise
    /// `/dev/shm/elastrec-<uid>` (`<temp dir>/elastrec-<uid>` without `/dev/shm`), opened
    /// with [`ShmRoot::open`].
    pub fn open_default() -> Result<Self> {
        Self::open(&default_root())
    }

    /// `dir` as the root: created with mode 0700 when missing (its parent must exist), then
    /// checked to be a directory (not a symbolic link) owned by this user with mode 0700.
    /// [`CheckpointError::ShmUnsafe`] when it is not; [`CheckpointError::ShmWrite`] when it
    /// cannot be created.
    pub fn open(dir: &Path) -> Result<Self> {
        create_private_dir(dir)?;
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    /// The root directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The image `<root>/<namespace>/<name>.img`. [`CheckpointError::Invalid`] when the
    /// namespace or the name is not a plain name (see [`validate_namespace`]).
    pub fn image(&self, namespace: &str, name: &str) -> Result<ShmImage> {
        validate_namespace(namespace)?;
        validate_name("image name", name)?;
        Ok(ShmImage {
            path: self.dir.join(namespace).join(format!("{name}.img")),
        })
    }

    /// Deletes every image of `namespace` (a job that ended); no error when there is none.
    pub fn remove_namespace(&self, namespace: &str) -> Result<()> {
        validate_namespace(namespace)?;
        let dir = self.dir.join(namespace);
        // remove_dir_all removes a symbolic link itself, never what it points to.
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(CheckpointError::io(dir, e)),
        }
    }
}

/// The shared-memory image of one named state (e.g. one PS shard) within a namespace
/// (e.g. one job).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShmImage {
    path: PathBuf,
}

impl ShmImage {
    /// The image `<name>.img` of `namespace` under this process's root
    /// ([`ShmRoot::open_default`]). Errors: a namespace or name that is not a plain name
    /// ([`CheckpointError::Invalid`]), a root that is not private
    /// ([`CheckpointError::ShmUnsafe`]) or cannot be created ([`CheckpointError::ShmWrite`]).
    pub fn new(namespace: &str, name: &str) -> Result<Self> {
        // Names first, so that a bad one does not even create the root.
        validate_namespace(namespace)?;
        validate_name("image name", name)?;
        ShmRoot::open_default()?.image(namespace, name)
    }

    /// The same image under the root `root` ([`ShmRoot::open`]).
    pub fn in_root(root: &Path, namespace: &str, name: &str) -> Result<Self> {
        validate_namespace(namespace)?;
        validate_name("image name", name)?;
        ShmRoot::open(root)?.image(namespace, name)
    }

    /// The image file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The namespace directory holding the image.
    fn dir(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("."))
    }

    /// Replaces the image with `bytes`, the state as of checkpoint `id`, atomically.
    ///
    /// [`CheckpointError::ShmWrite`] when shared memory cannot take it (full, or any I/O
    /// error): nothing of the new image is left behind and the previous image, if any, is
    /// unchanged, so the caller can go on and persist the checkpoint to storage only.
    /// [`CheckpointError::ShmUnsafe`] when the namespace directory is not private.
    pub fn write(&self, id: CheckpointId, bytes: &[u8]) -> Result<()> {
        create_private_dir(self.dir())?;
        let tmp = self.tmp_path();
        // create_new is O_CREAT|O_EXCL: it never opens an existing file and fails on a link
        // even where O_NOFOLLOW would be ignored; O_NOFOLLOW states the intent explicitly.
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(IMAGE_MODE)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .map_err(|e| write_failed(&self.path, e))?;
        let written = write_image(&mut file, id, bytes);
        drop(file);
        if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, &self.path)) {
            // The temporary file is ours (created exclusively above). Leaving it would keep
            // holding the memory it filled, which is exactly what a full /dev/shm lacks.
            let _ = std::fs::remove_file(&tmp);
            return Err(write_failed(&self.path, e));
        }
        Ok(())
    }

    /// The image's checkpoint id and bytes; `None` when there is no image.
    /// [`CheckpointError::Corrupt`] or [`CheckpointError::BadImage`] when it must not be used
    /// (a symbolic link or anything but a regular file is `BadImage` and is not opened).
    pub fn read(&self) -> Result<Option<(CheckpointId, Vec<u8>)>> {
        match std::fs::symlink_metadata(self.dir()) {
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            _ => check_private_dir(self.dir())?,
        }
        // O_NOFOLLOW: a link planted at the image's name is refused, not read through.
        // O_NONBLOCK: opening a FIFO planted there would otherwise block the restore; it
        // changes nothing for a regular file.
        let opened = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&self.path);
        let mut file = match opened {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Err(self.bad("is a symbolic link, which is never followed; remove it"))
            }
            Err(e) => return Err(CheckpointError::io(&self.path, e)),
        };
        let meta = file
            .metadata()
            .map_err(|e| CheckpointError::io(&self.path, e))?;
        if !meta.is_file() {
            return Err(self.bad("not a regular file; remove it"));
        }
        let file_len = meta.len();
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

    /// Deletes the image (no error when there is none), freeing its memory. A symbolic
    /// link at its name is removed itself, not its target.
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

/// Checks that `namespace` can name a directory of images: 1 to [`MAX_NAME_LEN`] bytes of
/// `[A-Za-z0-9._-]`, not starting with `.` and without `..`, so it is one plain path
/// component. [`CheckpointError::Invalid`] otherwise.
pub fn validate_namespace(namespace: &str) -> Result<()> {
    validate_name("namespace", namespace)
}

fn validate_name(what: &str, name: &str) -> Result<()> {
    let bad = |why: String| {
        // An overlong name is shown cut: the message is for a person, not a copy of input.
        let shown: String = name.chars().take(MAX_NAME_LEN).collect();
        let cut = if shown.len() < name.len() { "..." } else { "" };
        Err(CheckpointError::Invalid(format!(
            "shared-memory {what} `{shown}{cut}` {why}"
        )))
    };
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return bad(format!("must have 1 to {MAX_NAME_LEN} characters"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return bad(format!("contains `{c}` (allowed: A-Z a-z 0-9 . _ -)"));
    }
    if name.starts_with('.') {
        return bad("must not start with `.`".into());
    }
    if name.contains("..") {
        return bad("must not contain `..`".into());
    }
    Ok(())
}

/// Creates `dir` with mode 0700 unless it exists, then checks it is private.
fn create_private_dir(dir: &Path) -> Result<()> {
    match DirBuilder::new().mode(PRIVATE_DIR_MODE).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(e) => return Err(write_failed(dir, e)),
    }
    check_private_dir(dir)
}

/// [`CheckpointError::ShmUnsafe`] unless `dir` is a directory, not a symbolic link, owned by
/// this user, with mode 0700. Not repaired: someone else may have made it so on purpose.
fn check_private_dir(dir: &Path) -> Result<()> {
    let meta = std::fs::symlink_metadata(dir).map_err(|e| CheckpointError::io(dir, e))?;
    let refuse = |reason: String| {
        Err(CheckpointError::ShmUnsafe {
            path: dir.to_path_buf(),
            reason,
        })
    };
    if meta.file_type().is_symlink() {
        return refuse("it is a symbolic link, and images are never written through links".into());
    }
    if !meta.is_dir() {
        return refuse("it is not a directory".into());
    }
    let me = current_uid();
    if meta.uid() != me {
        return refuse(format!(
            "it is owned by uid {}, not by this user (uid {me}), who could then not keep \
             others from reading or replacing the images",
            meta.uid()
        ));
    }
    let mode = meta.mode() & 0o7777;
    if mode != PRIVATE_DIR_MODE {
        return refuse(format!(
            "it has mode {mode:04o} instead of 0700, so other users may read or replace the \
             images; if you made it, `chmod 700` it"
        ));
    }
    Ok(())
}

fn write_failed(path: &Path, source: std::io::Error) -> CheckpointError {
    CheckpointError::ShmWrite {
        path: path.to_path_buf(),
        source,
    }
}

/// The effective uid, which owns the files this process creates.
fn current_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
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

/// Writes a complete image to `file`. No fsync: shared memory does not survive a reboot
/// anyway, and the rename already protects readers from a writer that dies half way.
fn write_image(file: &mut File, id: CheckpointId, bytes: &[u8]) -> std::io::Result<()> {
    let header = Header {
        magic: *MAGIC,
        version: VERSION,
        id,
        len: bytes.len() as u64,
        checksum: image_checksum(id, bytes),
    };
    file.write_all(&header.encode())?;
    file.write_all(bytes)
}

/// `$ELASTREC_SHM_ROOT`, else `/dev/shm/elastrec-<uid>` on Linux, else
/// `<temp dir>/elastrec-<uid>`. Per user, so that users never share (or fight over) a
/// directory: the first user to create a shared one would own everybody's images.
fn default_root() -> PathBuf {
    if let Some(dir) = std::env::var_os(SHM_ROOT_ENV).filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    base.join(format!("elastrec-{}", current_uid()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_must_be_plain_path_components() {
        let longest = "x".repeat(MAX_NAME_LEN);
        let too_long = "x".repeat(MAX_NAME_LEN + 1);
        for ok in ["job-1.ps_0", "a", "ps-0-of-2-ckpt-7", longest.as_str()] {
            assert!(validate_namespace(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "../etc",
            "a/b",
            "a..b",
            ".hidden",
            "a b",
            "job\0",
            "caf\u{e9}",
            too_long.as_str(),
        ] {
            match validate_namespace(bad) {
                Err(CheckpointError::Invalid(msg)) => assert!(msg.contains("namespace"), "{msg}"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
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
    fn image_path_is_root_namespace_name() {
        let root = ShmRoot {
            dir: PathBuf::from("/r"),
        };
        let img = root.image("job-1", "ps-0").unwrap();
        assert_eq!(img.path(), Path::new("/r/job-1/ps-0.img"));
        assert!(root.image("job/1", "ps-0").is_err());
        assert!(root.image("job-1", "../ps-0").is_err());
    }
}
