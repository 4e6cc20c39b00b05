//! Crash-safe file writes for the run directory (`model.bin`, `summary.json`).
//!
//! A reader of the run directory (`elastrec eval`, a script polling `summary.json`, a
//! restarted job) must see either the old file or the complete new one, never a prefix.
//! So the bytes go to a temporary file next to the target (same directory, hence same
//! file system, so the rename is atomic), are flushed to disk, and only then renamed over
//! the target; the directory is synced so the rename itself survives a crash.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::{JobError, Result};

/// The temporary name [`write_atomic_with`] writes to before renaming: `<name>.tmp` in the
/// same directory.
pub fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

/// Atomically replaces `path` with `bytes`: see the module docs.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic_with(path, |w| {
        w.write_all(bytes).map_err(|e| JobError::io(path, e))
    })
}

/// Atomically replaces `path` with what `fill` writes (for output streamed in pieces).
///
/// If `fill` or any step fails, the temporary file is removed and `path` is untouched.
/// `fill` fails with the caller's error type, which takes in this module's I/O errors.
pub fn write_atomic_with<E: From<JobError>>(
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> Result<(), E>,
) -> Result<(), E> {
    let tmp = temp_path(path);
    let result = write_then_rename(path, &tmp, fill);
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

fn write_then_rename<E: From<JobError>>(
    path: &Path,
    tmp: &Path,
    fill: impl FnOnce(&mut dyn Write) -> Result<(), E>,
) -> Result<(), E> {
    let io = |e| E::from(JobError::io(tmp, e));
    let mut w = BufWriter::new(File::create(tmp).map_err(io)?);
    fill(&mut w)?;
    let file = w.into_inner().map_err(|e| io(e.into_error()))?;
    // Data on disk before the rename: otherwise a crash can leave the new name pointing
    // at an empty or partial file.
    file.sync_all().map_err(io)?;
    drop(file);
    std::fs::rename(tmp, path).map_err(|e| E::from(JobError::io(path, e)))?;
    sync_dir(path);
    Ok(())
}

/// Makes the rename durable. Best effort: some file systems refuse to sync a directory,
/// and by then the new file is complete under its final name either way.
fn sync_dir(path: &Path) {
    #[cfg(unix)]
    if let Some(dir) = path.parent() {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
    #[cfg(not(unix))]
    let _ = path;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_whole_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("summary.json");
        std::fs::write(&p, "an old, longer content that must not survive as a tail").unwrap();
        write_atomic(&p, b"{\"new\": true}").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "{\"new\": true}");
        assert!(!temp_path(&p).exists());
        assert_eq!(temp_path(&p), dir.path().join("summary.json.tmp"));
    }

    /// A write that fails half way leaves the previous file intact: the partial output
    /// only ever existed under the temporary name, which is removed.
    #[test]
    fn a_failed_write_keeps_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("model.bin");
        std::fs::write(&p, b"old model").unwrap();
        let err = write_atomic_with(&p, |w| {
            w.write_all(b"half of a new mod").unwrap();
            Err(JobError::io(
                &p,
                std::io::Error::other("disk full (simulated)"),
            ))
        })
        .unwrap_err();
        assert!(err.to_string().contains("disk full"), "{err}");
        assert_eq!(std::fs::read(&p).unwrap(), b"old model");
        assert!(!temp_path(&p).exists());
    }

    /// Errors name the file: a directory that does not exist fails at the temporary file.
    #[test]
    fn errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("missing").join("summary.json");
        let err = write_atomic(&p, b"{}").unwrap_err().to_string();
        assert!(err.contains("summary.json.tmp"), "{err}");
    }
}
