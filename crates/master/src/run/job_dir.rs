//! The files of a job directory, and the private files the master writes there.

use std::path::Path;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

pub use elastrec_client::JobDir;

/// Sends this process's job events (those emitted so far first) to the job directory's
/// events file.
pub fn attach_events(dir: &JobDir) -> anyhow::Result<()> {
    crate::events::attach(&dir.events())
        .with_context(|| format!("opening {}", dir.events().display()))
}

/// A training file and its row count, as recorded at job start.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FileRows {
    /// Absolute path.
    pub path: String,
    /// Rows.
    pub rows: u64,
    /// Its `[[data.source]]` (by position; 0 without sources or for a stream partition).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub source: u32,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}
/// Writes `text` to a file only its owner can read or write (mode 0600): tokens.
pub(super) fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(text.as_bytes())?;
    Ok(())
}
