//! The distributed job file: the single-process job ([`JobConfig`]'s sections) plus a
//! `[cluster]` section for `elastrec run` (parameter servers, workers, sharding, failure
//! policy). Typo-proof like the rest: unknown keys are errors naming the key.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::{
    ConfigError, DataConfig, JobConfig, ModelConfig, OptimizerConfig, OutputConfig, TrainConfig,
};

/// How gradients from several workers meet on the PS.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SyncMode {
    /// Every push is applied at once; a worker's dense copy lags the PS by at most
    /// `cluster.staleness` updates.
    #[default]
    Async,
    /// Gradients of one global step from every active worker are averaged, then applied.
    Sync,
}

/// The `[cluster]` section.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// Number of parameter servers.
    pub ps: u32,
    /// Number of workers at start (change at runtime with `elastrec scale`).
    pub workers: u32,
    /// `"async"` (bounded staleness) or `"sync"`.
    pub mode: SyncMode,
    /// Async mode: dense-parameter updates a worker may lag behind before it re-pulls.
    pub staleness: u32,
    /// Sync mode: how long a PS waits for the missing gradients of a step (ms) before it
    /// applies the ones it has (a worker may have died).
    pub sync_timeout_ms: u64,
    /// Batches per data shard (task).
    pub batches_per_shard: u32,
    /// Shuffle the order of shards in every epoch.
    pub shuffle: bool,
    /// Seed of the shard shuffle.
    pub seed: u64,
    /// Heartbeat interval of every node (ms).
    pub heartbeat_ms: u64,
    /// A node silent this long is declared dead (ms).
    pub dead_after_ms: u64,
    /// A worker slower than this fraction of its peers' median rate gets half-size shards.
    pub straggler_ratio: f64,
    /// Dead workers relaunched over the whole job.
    pub max_worker_restarts: u32,
    /// Address the master and the PS bind to.
    pub bind: String,
    /// Port of the master's gRPC service (0: any free port).
    pub master_port: u16,
    /// Port of the master's Prometheus `/metrics` endpoint (0: any free port).
    pub metrics_port: u16,
    /// Largest gRPC message accepted (bytes).
    pub max_message_bytes: usize,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            ps: 1,
            workers: 2,
            mode: SyncMode::Async,
            staleness: 4,
            sync_timeout_ms: 2000,
            batches_per_shard: 16,
            shuffle: true,
            seed: 7,
            heartbeat_ms: 500,
            dead_after_ms: 5000,
            straggler_ratio: 0.5,
            max_worker_restarts: 8,
            bind: "127.0.0.1".into(),
            master_port: 0,
            metrics_port: 0,
            max_message_bytes: 64 << 20,
        }
    }
}

/// A distributed job: the training job plus its cluster layout.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterJob {
    /// Where the samples come from.
    pub data: DataConfig,
    /// Model shape.
    pub model: ModelConfig,
    /// Loop settings.
    pub train: TrainConfig,
    /// Dense and sparse optimizers.
    pub optimizer: OptimizerConfig,
    /// Where results go (the job directory).
    pub output: OutputConfig,
    /// Processes and policies.
    pub cluster: ClusterConfig,
}

impl ClusterJob {
    /// The single-process view of the job (same data, model, optimizer).
    pub fn job(&self) -> JobConfig {
        JobConfig {
            data: self.data.clone(),
            model: self.model.clone(),
            train: self.train.clone(),
            optimizer: self.optimizer.clone(),
            output: self.output.clone(),
        }
    }

    /// Parses and validates TOML text; `path` only names the source in errors.
    pub fn from_toml(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let cfg: ClusterJob = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        cfg.job().validate(path)?;
        cfg.validate_cluster(path)?;
        Ok(cfg)
    }

    /// Reads a job file; relative data and output paths resolve against its directory.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut cfg = Self::from_toml(&text, path)?;
        let base = path.parent().unwrap_or(Path::new("."));
        cfg.data.dir = absolute(&base.join(&cfg.data.dir));
        cfg.output.dir = absolute(&base.join(&cfg.output.dir));
        Ok(cfg)
    }

    /// Checks that every training and evaluation file exists (unless the data is to be
    /// generated), naming the field at fault.
    pub fn check_data(&self, path: &Path) -> Result<(), ConfigError> {
        if self.data.generate.is_some() && !self.data.dir.exists() {
            return Ok(());
        }
        let job = self.job();
        for (field, files) in [
            ("data.train", job.train_files()),
            ("data.eval", job.eval_files()),
        ] {
            for f in files {
                if !f.is_file() {
                    return Err(ConfigError::Invalid {
                        path: path.to_path_buf(),
                        field,
                        reason: format!(
                            "data file {} does not exist (data.dir is {})",
                            f.display(),
                            self.data.dir.display()
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    fn validate_cluster(&self, path: &Path) -> Result<(), ConfigError> {
        let bad = |field: &'static str, reason: &str| ConfigError::Invalid {
            path: path.to_path_buf(),
            field,
            reason: reason.to_string(),
        };
        let c = &self.cluster;
        if c.ps == 0 || c.ps > 64 {
            return Err(bad("cluster.ps", "must be between 1 and 64"));
        }
        if c.workers == 0 || c.workers > 256 {
            return Err(bad("cluster.workers", "must be between 1 and 256"));
        }
        if c.batches_per_shard == 0 {
            return Err(bad("cluster.batches_per_shard", "must be at least 1"));
        }
        if c.heartbeat_ms == 0 {
            return Err(bad("cluster.heartbeat_ms", "must be at least 1"));
        }
        if c.dead_after_ms < 2 * c.heartbeat_ms {
            return Err(bad(
                "cluster.dead_after_ms",
                "must be at least twice cluster.heartbeat_ms",
            ));
        }
        if !(c.straggler_ratio.is_finite() && (0.0..=1.0).contains(&c.straggler_ratio)) {
            return Err(bad("cluster.straggler_ratio", "must be between 0 and 1"));
        }
        if c.bind.parse::<std::net::IpAddr>().is_err() {
            return Err(bad(
                "cluster.bind",
                "must be an IP address such as 127.0.0.1",
            ));
        }
        if c.max_message_bytes < 1 << 20 {
            return Err(bad("cluster.max_message_bytes", "must be at least 1 MiB"));
        }
        Ok(())
    }
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ClusterJob, ConfigError> {
        ClusterJob::from_toml(text, Path::new("job.toml"))
    }

    #[test]
    fn defaults_and_cluster_section() {
        let c = parse("[cluster]\nps = 2\nworkers = 3\nmode = \"sync\"\n").unwrap();
        assert_eq!((c.cluster.ps, c.cluster.workers), (2, 3));
        assert_eq!(c.cluster.mode, SyncMode::Sync);
        assert_eq!(c.job().train.batch_size, 2048);
    }

    #[test]
    fn bad_fields_are_named() {
        let e = parse("[cluster]\nworkerz = 3\n").unwrap_err().to_string();
        assert!(e.contains("workerz"), "{e}");
        let e = parse("[cluster]\nworkers = -1\n").unwrap_err().to_string();
        assert!(e.contains("workers"), "{e}");
        let e = parse("[cluster]\nps = 0\n").unwrap_err().to_string();
        assert!(e.contains("cluster.ps"), "{e}");
        let e = parse("[train]\nbatch_size = 0\n").unwrap_err().to_string();
        assert!(e.contains("train.batch_size"), "{e}");
    }

    #[test]
    fn missing_data_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("job.toml");
        std::fs::write(
            &p,
            "[data]\ndir = \"nowhere\"\ntrain = [\"a.tsv\"]\neval = []\n",
        )
        .unwrap();
        let c = ClusterJob::load(&p).unwrap();
        let e = c.check_data(&p).unwrap_err().to_string();
        assert!(e.contains("data.train") && e.contains("a.tsv"), "{e}");
    }
}
