//! Errors of the checkpoint crate.
//!
//! Every variant names the checkpoint, part and location involved, because the person
//! reading the message is usually debugging a failed restore on a cluster and needs to know
//! which object to look at.

use std::path::PathBuf;

use crate::format::CheckpointId;

/// Which integrity check a stored part or image failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// The byte count differs from the recorded one (truncated or overwritten).
    Size,
    /// The xxh3 checksum differs (bit rot, partial write, foreign data).
    Checksum,
}

impl std::fmt::Display for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Check::Size => write!(f, "size"),
            Check::Checksum => write!(f, "xxh3 checksum"),
        }
    }
}

/// What can go wrong with a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The checkpoint has no manifest: it does not exist or was never committed.
    #[error("checkpoint {id} not found at {location}")]
    NotFound {
        /// The checkpoint asked for.
        id: CheckpointId,
        /// Where its manifest was looked for.
        location: String,
    },

    /// The manifest does not list the part asked for (a caller bug or a different layout).
    #[error("checkpoint {id} has no part `{part}`")]
    UnknownPart {
        /// The checkpoint.
        id: CheckpointId,
        /// The part asked for.
        part: String,
    },

    /// A part listed by the manifest (or about to be) is missing from storage.
    #[error("checkpoint {id} is incomplete: part `{part}` is missing at {location}")]
    Incomplete {
        /// The checkpoint.
        id: CheckpointId,
        /// The missing part.
        part: String,
        /// Where the part was expected.
        location: String,
    },

    /// A stored part or shared-memory image does not match what was recorded.
    #[error(
        "checkpoint {id} part `{part}` at {location} is corrupt: {check} expected {expected:#x}, found {found:#x}"
    )]
    Corrupt {
        /// The checkpoint.
        id: CheckpointId,
        /// The damaged part (or image name).
        part: String,
        /// Where it is stored.
        location: String,
        /// Which check failed.
        check: Check,
        /// Recorded value.
        expected: u64,
        /// Value of the stored bytes.
        found: u64,
    },

    /// A shared-memory image file is not an image this version can read (bad magic,
    /// unknown version, truncated header).
    #[error("shared-memory image {path} is unreadable: {reason}")]
    BadImage {
        /// The image file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },

    /// Shared memory could not take an image: `/dev/shm` is full (`ENOSPC`), or creating
    /// the directory or writing the file failed otherwise. Nothing of the new image is left
    /// behind and the previous image is unchanged; the checkpoint itself is not lost, so
    /// the caller should persist it to storage only ([`CheckpointError::is_shm_unavailable`]).
    #[error("cannot write shared-memory image {}: {source}; {}", path.display(), shm_write_hint(source))]
    ShmWrite {
        /// The image (or directory) being written.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// The shared-memory root or a namespace directory is not private to this user (a
    /// symbolic link, not a directory, another owner, a mode other than 0700), so images
    /// are not read from or written to it.
    #[error(
        "refusing shared-memory directory {}: {reason}. Remove it, or set ELASTREC_SHM_ROOT \
         to a directory of your own with mode 0700; until then checkpoints skip shared memory",
        path.display()
    )]
    ShmUnsafe {
        /// The refused directory.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },

    /// A delta checkpoint's base chain is broken (missing base, cycle, base not older).
    #[error("checkpoint {id} cannot be restored: {reason}")]
    BrokenChain {
        /// The checkpoint whose chain is broken.
        id: CheckpointId,
        /// Why.
        reason: String,
    },

    /// A manifest for this id exists already; checkpoints are immutable once committed.
    #[error("checkpoint {id} is already committed at {location}")]
    AlreadyCommitted {
        /// The checkpoint.
        id: CheckpointId,
        /// Its manifest.
        location: String,
    },

    /// The caller passed an argument this crate refuses (bad part name, bad manifest, ...).
    #[error("invalid argument: {0}")]
    Invalid(String),

    /// The object store failed (network, permissions, missing bucket, ...).
    #[error("storage error at {location}: {source}")]
    Storage {
        /// The object or prefix being accessed.
        location: String,
        /// The store's error.
        #[source]
        source: object_store::Error,
    },

    /// A local file operation failed.
    #[error("I/O error on {}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// A manifest could not be (de)serialized.
    #[error("bad manifest JSON at {location}: {source}")]
    Json {
        /// The manifest's location.
        location: String,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },

    /// The checkpoint location (URL or path) is not usable.
    #[error("bad checkpoint location `{location}`: {reason}")]
    Config {
        /// The location as given.
        location: String,
        /// Why it was refused.
        reason: String,
    },

    /// Any other failure, described.
    #[error("{0}")]
    Other(String),
}

impl CheckpointError {
    /// Wraps an object store error with the location being accessed.
    pub fn storage(location: impl Into<String>, source: object_store::Error) -> Self {
        Self::Storage {
            location: location.into(),
            source,
        }
    }

    /// Wraps an I/O error with the path being accessed.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }

    /// True for [`CheckpointError::Corrupt`] and [`CheckpointError::BadImage`]: the data
    /// exists but must not be used.
    pub fn is_corrupt(&self) -> bool {
        matches!(self, Self::Corrupt { .. } | Self::BadImage { .. })
    }

    /// True for [`CheckpointError::ShmWrite`] and [`CheckpointError::ShmUnsafe`]: shared
    /// memory cannot hold an image right now. A checkpoint should then skip the image and go
    /// to storage only; a restore should read storage.
    pub fn is_shm_unavailable(&self) -> bool {
        matches!(self, Self::ShmWrite { .. } | Self::ShmUnsafe { .. })
    }
}

/// What to do about a failed shared-memory write.
fn shm_write_hint(e: &std::io::Error) -> &'static str {
    if e.kind() == std::io::ErrorKind::StorageFull {
        "shared memory is full: free it or enlarge /dev/shm (e.g. `docker run --shm-size`); \
         the checkpoint can still be persisted to storage without the image"
    } else {
        "the checkpoint can still be persisted to storage without the image"
    }
}

/// Result with [`CheckpointError`].
pub type Result<T> = std::result::Result<T, CheckpointError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corrupt_message_names_checkpoint_part_and_location() {
        let e = CheckpointError::Corrupt {
            id: 12,
            part: "ps-0".into(),
            location: "/ckpt/ckpt-000000000012/ps-0".into(),
            check: Check::Checksum,
            expected: 0xab,
            found: 0xcd,
        };
        let msg = e.to_string();
        for needle in [
            "12",
            "ps-0",
            "/ckpt/ckpt-000000000012/ps-0",
            "checksum",
            "0xab",
        ] {
            assert!(msg.contains(needle), "{msg} lacks {needle}");
        }
        assert!(e.is_corrupt());
    }
}
