//! The files of a job directory, and the private files the master writes there.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

/// Files of a job directory.
pub struct JobDir(pub PathBuf);

impl JobDir {
    /// The state database.
    pub fn db(&self) -> PathBuf {
        self.0.join("master.db")
    }
    /// The per-job token (mode 0600).
    pub fn token(&self) -> PathBuf {
        self.0.join("token")
    }
    /// The master's gRPC address.
    pub fn addr(&self) -> PathBuf {
        self.0.join("master.addr")
    }
    /// The `/metrics` address.
    pub fn metrics_addr(&self) -> PathBuf {
        self.0.join("metrics.addr")
    }
    /// The job's result.
    pub fn result(&self) -> PathBuf {
        self.0.join("result.json")
    }
    /// The job's events, one JSON object per line (`crate::events`).
    pub fn events(&self) -> PathBuf {
        self.0.join("events.jsonl")
    }
    /// Sends this process's job events (those emitted so far first) to [`JobDir::events`].
    pub fn attach_events(&self) -> anyhow::Result<()> {
        crate::events::attach(&self.events())
            .with_context(|| format!("opening {}", self.events().display()))
    }
    /// Node logs.
    pub fn logs(&self) -> PathBuf {
        self.0.join("logs")
    }
    /// The job's TLS material (when its channels use TLS).
    pub fn tls(&self) -> PathBuf {
        self.0.join("tls")
    }
    /// When the job first started (ms since the epoch, written once at start).
    pub fn started_ms_file(&self) -> PathBuf {
        self.0.join("started_ms")
    }
    /// The job's first start time, when recorded.
    pub fn started_ms(&self) -> Option<u64> {
        std::fs::read_to_string(self.started_ms_file())
            .ok()?
            .trim()
            .parse()
            .ok()
    }
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
