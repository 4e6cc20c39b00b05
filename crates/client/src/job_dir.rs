//! The files of a job directory.

use std::path::PathBuf;

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
    /// The job's events, one JSON object per line.
    pub fn events(&self) -> PathBuf {
        self.0.join("events.jsonl")
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
