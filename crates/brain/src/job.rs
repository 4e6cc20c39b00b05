//! Job descriptions: the typed job spec the brain plans for, and the TOML job file read by
//! `elastrec brain plan --job job.toml` (documented in `docs/brain.md`).

use serde::{Deserialize, Serialize};

use crate::alloc::{Allocation, Bounds};
use crate::error::{BrainError, Result};
use crate::oom::MemorySample;
use crate::throughput::ProfileSample;

/// Largest row count of one table accepted (absurd sizes are rejected).
pub const MAX_ROWS: u64 = 1 << 40;
/// Largest embedding dimension accepted.
pub const MAX_DIM: u32 = 1 << 16;
/// Most tables accepted.
pub const MAX_TABLES: usize = 100_000;
/// Largest per-worker batch accepted.
pub const MAX_BATCH: u32 = 1 << 24;
/// Longest id or tag accepted, bytes.
pub const MAX_NAME: usize = 256;

/// One embedding table.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableSpec {
    /// Rows (distinct ids).
    pub rows: u64,
    /// Embedding dimension.
    pub dim: u32,
}

/// What the brain knows about a job's model and data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// Unique job id.
    pub job_id: String,
    /// Model family (default "dlrm").
    #[serde(default = "default_model_type")]
    pub model_type: String,
    /// Embedding tables.
    pub tables: Vec<TableSpec>,
    /// Dense parameters (MLPs).
    #[serde(default)]
    pub dense_params: u64,
    /// Samples in the dataset.
    pub dataset_samples: u64,
    /// Mini-batch per worker (default 512).
    #[serde(default = "default_batch")]
    pub batch_size: u32,
    /// Scenario tag (default "").
    #[serde(default)]
    pub scenario: String,
    /// User tag (default "").
    #[serde(default)]
    pub user: String,
    /// Allocation bounds (defaults: [`Bounds::default`]).
    #[serde(default)]
    pub bounds: Bounds,
    /// The configuration the user asked for: warm start's start-up plan while the config
    /// database holds no similar job (default: none, the documented default plan).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested: Option<Allocation>,
}

fn default_model_type() -> String {
    "dlrm".into()
}
fn default_batch() -> u32 {
    512
}

fn check_name(field: &str, v: &str, required: bool) -> Result<()> {
    if required && v.is_empty() {
        return Err(BrainError::invalid(field, "must not be empty"));
    }
    if v.len() > MAX_NAME || v.chars().any(char::is_control) {
        return Err(BrainError::invalid(
            field,
            format!("at most {MAX_NAME} printable bytes"),
        ));
    }
    Ok(())
}

impl JobSpec {
    /// Validates ids, sizes and bounds, naming the offending field.
    pub fn validate(&self) -> Result<()> {
        check_name("job_id", &self.job_id, true)?;
        check_name("model_type", &self.model_type, true)?;
        check_name("scenario", &self.scenario, false)?;
        check_name("user", &self.user, false)?;
        if self.tables.is_empty() || self.tables.len() > MAX_TABLES {
            return Err(BrainError::invalid(
                "tables",
                format!("need 1..={MAX_TABLES} tables, got {}", self.tables.len()),
            ));
        }
        for (i, t) in self.tables.iter().enumerate() {
            if t.rows == 0 || t.rows > MAX_ROWS {
                return Err(BrainError::invalid(
                    format!("tables[{i}].rows"),
                    format!("need 1..={MAX_ROWS}, got {}", t.rows),
                ));
            }
            if t.dim == 0 || t.dim > MAX_DIM {
                return Err(BrainError::invalid(
                    format!("tables[{i}].dim"),
                    format!("need 1..={MAX_DIM}, got {}", t.dim),
                ));
            }
        }
        if self.dense_params > MAX_ROWS {
            return Err(BrainError::invalid(
                "dense_params",
                format!("{} is absurd", self.dense_params),
            ));
        }
        if self.batch_size == 0 || self.batch_size > MAX_BATCH {
            return Err(BrainError::invalid(
                "batch_size",
                format!("need 1..={MAX_BATCH}, got {}", self.batch_size),
            ));
        }
        if let Some(r) = &self.requested {
            r.validate("requested")?;
        }
        self.bounds.validate()
    }
}

/// The TOML job file of `elastrec brain plan --job job.toml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobFile {
    /// The job (`[job]`, with `[job.bounds]` and `[[job.tables]]`).
    pub job: JobSpec,
    /// Samples still to train (default: the whole dataset).
    #[serde(default)]
    pub remaining_samples: Option<u64>,
    /// What the job runs with now (`[current]`); absent: a new job.
    #[serde(default)]
    pub current: Option<Allocation>,
    /// Cluster the plan must fit in (`[cluster]`).
    #[serde(default)]
    pub cluster: ClusterFile,
    /// Runtime profile (`[[profile]]`), optional.
    #[serde(default)]
    pub profile: Vec<ProfileRow>,
    /// PS memory readings (`[[memory]]`), optional.
    #[serde(default)]
    pub memory: Vec<MemorySample>,
    /// Current and final training step, for OOM prediction.
    #[serde(default)]
    pub steps: Option<StepsFile>,
}

/// `[cluster]` of a job file.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    /// Free CPU cores for this job (default 1024).
    #[serde(default = "ClusterFile::default_cpu")]
    pub cpu: f64,
    /// Free memory for this job, GiB (default 4096).
    #[serde(default = "ClusterFile::default_mem")]
    pub mem_gb: f64,
    /// Price per core-hour (default 1.0).
    #[serde(default = "ClusterFile::default_cpu_price")]
    pub cpu_price: f64,
    /// Price per GiB-hour (default 0.25).
    #[serde(default = "ClusterFile::default_mem_price")]
    pub mem_price: f64,
    /// Worker-PS network bandwidth, MB/s (default 1250 = 10 Gbit/s).
    #[serde(default = "ClusterFile::default_bw")]
    pub bandwidth_mb_s: f64,
}

impl ClusterFile {
    fn default_cpu() -> f64 {
        1024.0
    }
    fn default_mem() -> f64 {
        4096.0
    }
    fn default_cpu_price() -> f64 {
        1.0
    }
    fn default_mem_price() -> f64 {
        0.25
    }
    fn default_bw() -> f64 {
        1250.0
    }
}

impl Default for ClusterFile {
    fn default() -> Self {
        Self {
            cpu: Self::default_cpu(),
            mem_gb: Self::default_mem(),
            cpu_price: Self::default_cpu_price(),
            mem_price: Self::default_mem_price(),
            bandwidth_mb_s: Self::default_bw(),
        }
    }
}

/// `[steps]` of a job file.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepsFile {
    /// Step reached.
    pub current: u64,
    /// Step at which the job ends.
    pub total: u64,
}

/// One `[[profile]]` row: the allocation and the measured iteration time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileRow {
    /// Workers.
    pub workers: u32,
    /// PS.
    pub ps: u32,
    /// Cores per worker.
    pub worker_cpu: f64,
    /// Cores per PS.
    pub ps_cpu: f64,
    /// GiB per worker (default 8).
    #[serde(default = "default_mem")]
    pub worker_mem_gb: f64,
    /// GiB per PS (default 16).
    #[serde(default = "default_ps_mem")]
    pub ps_mem_gb: f64,
    /// Batch per worker (default: the job's).
    #[serde(default)]
    pub batch_size: Option<u32>,
    /// Mean seconds per iteration.
    pub iter_time_s: f64,
}

fn default_mem() -> f64 {
    8.0
}
fn default_ps_mem() -> f64 {
    16.0
}

impl JobFile {
    /// Parses and validates a job file's text.
    pub fn parse(text: &str) -> Result<Self> {
        let f: JobFile =
            toml::from_str(text).map_err(|e| BrainError::invalid("job file", e.to_string()))?;
        f.job.validate()?;
        if let Some(c) = &f.current {
            c.validate("current")?;
        }
        for (name, v) in [
            ("cluster.cpu", f.cluster.cpu),
            ("cluster.mem_gb", f.cluster.mem_gb),
            ("cluster.cpu_price", f.cluster.cpu_price),
            ("cluster.mem_price", f.cluster.mem_price),
            ("cluster.bandwidth_mb_s", f.cluster.bandwidth_mb_s),
        ] {
            crate::error::check_positive(name, v)?;
        }
        for (i, s) in f.samples().iter().enumerate() {
            s.validate(i)?;
        }
        if let Some(s) = f.steps {
            if s.current > s.total {
                return Err(BrainError::invalid("steps", "current is after total"));
            }
        }
        Ok(f)
    }

    /// Reads and parses a job file.
    pub fn read(path: &std::path::Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| BrainError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text)
    }

    /// The profile as samples.
    pub fn samples(&self) -> Vec<ProfileSample> {
        self.profile
            .iter()
            .map(|r| ProfileSample {
                alloc: Allocation {
                    workers: r.workers,
                    ps: r.ps,
                    worker_cpu: r.worker_cpu,
                    ps_cpu: r.ps_cpu,
                    worker_mem_gb: r.worker_mem_gb,
                    ps_mem_gb: r.ps_mem_gb,
                },
                batch_size: r.batch_size.unwrap_or(self.job.batch_size),
                iter_time_s: r.iter_time_s,
            })
            .collect()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn spec(id: &str) -> JobSpec {
        JobSpec {
            job_id: id.into(),
            model_type: "dlrm".into(),
            tables: vec![
                TableSpec {
                    rows: 1_000_000,
                    dim: 16,
                },
                TableSpec {
                    rows: 10_000,
                    dim: 16,
                },
            ],
            dense_params: 500_000,
            dataset_samples: 100_000_000,
            batch_size: 512,
            scenario: "ads".into(),
            user: "alice".into(),
            bounds: Bounds::default(),
            requested: None,
        }
    }

    #[test]
    fn parses_minimal_and_rejects_typos_and_absurd_sizes() {
        let f = JobFile::parse(
            r#"
            [job]
            job_id = "ctr"
            dataset_samples = 1000000
            tables = [{ rows = 1000, dim = 8 }]
            "#,
        )
        .unwrap();
        assert_eq!(f.job.batch_size, 512);
        assert_eq!(f.job.bounds, Bounds::default());
        let err = JobFile::parse("[job]\njob_id = \"x\"\ndataset_samples = 1\ntables = [{ rows = 1, dim = 8 }]\nbatchsize = 3\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field"), "{err}");
        let err = JobFile::parse(
            "[job]\njob_id = \"x\"\ndataset_samples = 1\ntables = [{ rows = 1, dim = 0 }]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("tables[0].dim"), "{err}");
        let err = JobFile::parse(
            "[job]\njob_id = \"x\"\ndataset_samples = 1\ntables = [{ rows = 1, dim = 8 }]\n[[profile]]\nworkers = 1\nps = 1\nworker_cpu = 1\nps_cpu = 1\niter_time_s = -1\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("samples[0].iter_time_s"), "{err}");
    }
}
