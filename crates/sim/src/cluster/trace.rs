//! Job traces: what was submitted to the cluster, when, and with what configuration the
//! user asked for. Generated from documented distributions ([`generate`]) or read from a
//! CSV a user exported from their own cluster ([`read_csv`]); the columns are documented
//! in `docs/simulator.md` and by [`COLUMNS`].

use std::path::Path;

use elastrec_brain::Allocation;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::truth::Truth;
use super::{job_rng, SimSetupError};

/// Offline (batch) training or online (streaming) training.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobKind {
    /// Trains a fixed number of samples, then ends (JCT is measured).
    Batch,
    /// Trains a stream for `duration_s` (lag and SLO are measured).
    Online,
}

/// One submitted job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    /// Unique id.
    pub job_id: String,
    /// Batch or online.
    pub kind: JobKind,
    /// Submission time, seconds from the trace's start.
    pub submit_s: f64,
    /// Model family (`dlrm`, `deepfm`, `dcn_v2`, `wide_deep`, ...): warm start compares it.
    pub model: String,
    /// Submitting user: warm start compares it.
    pub user: String,
    /// Embedding tables.
    pub tables: u32,
    /// Rows of each table.
    pub rows_per_table: u64,
    /// Embedding dimension.
    pub emb_dim: u32,
    /// Dense (MLP) parameters.
    pub dense_params: u64,
    /// Samples to train (batch jobs).
    pub samples: u64,
    /// Mini-batch per worker.
    pub batch_size: u32,
    /// Peak traffic, samples/s (online jobs).
    pub peak_rate: f64,
    /// How long the stream runs, seconds (online jobs).
    pub duration_s: f64,
    /// The configuration the user asked for.
    pub requested: Allocation,
}

/// The CSV columns, in order.
pub const COLUMNS: [&str; 19] = [
    "job_id",
    "kind",
    "submit_s",
    "model",
    "user",
    "tables",
    "rows_per_table",
    "emb_dim",
    "dense_params",
    "samples",
    "batch_size",
    "peak_rate",
    "duration_s",
    "workers",
    "ps",
    "worker_cpu",
    "ps_cpu",
    "worker_mem_gb",
    "ps_mem_gb",
];

/// Settings of a generated trace (see `docs/simulator.md` for the distributions).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TraceSpec {
    /// Batch jobs.
    pub jobs: usize,
    /// Online jobs.
    pub online_jobs: usize,
    /// Batch jobs arrive as a Poisson process over this many hours.
    pub span_h: f64,
    /// Online streams run this many hours.
    pub online_h: f64,
    /// Seed.
    pub seed: u64,
}

const MODELS: [&str; 4] = ["dlrm", "deepfm", "dcn_v2", "wide_deep"];
const USERS: u64 = 24;

fn log_uniform(rng: &mut impl Rng, lo: f64, hi: f64) -> f64 {
    (lo.ln() + rng.random::<f64>() * (hi.ln() - lo.ln())).exp()
}

/// A generated trace. Batch jobs arrive as a Poisson process; their sizes are log-uniform;
/// each user favours one model family and one size class (so warm start has similar jobs to
/// learn from); the requested configuration is the job's well-tuned one scaled by
/// log-uniform factors (workers 1/4..4, PS 1/2..2, PS memory 0.6..2 of what the model
/// state needs at the end), as users guess. Online jobs all start at 0.
pub fn generate(spec: &TraceSpec) -> Vec<JobRecord> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(spec.seed);
    let mean_gap = spec.span_h * 3600.0 / spec.jobs.max(1) as f64;
    let mut t = 0.0;
    let mut out = Vec::with_capacity(spec.jobs + spec.online_jobs);
    for i in 0..spec.jobs {
        t += -mean_gap * (1.0 - rng.random::<f64>()).ln();
        let user = rng.random_range(0..USERS);
        let mut urng = rand::rngs::StdRng::seed_from_u64(spec.seed ^ ((user + 1) * 0x9e37_79b9));
        let model = MODELS[urng.random_range(0..MODELS.len())];
        let size_class: f64 = urng.random_range(0.0..1.0);
        let scale = |rng: &mut rand::rngs::StdRng, lo: f64, hi: f64| {
            // Centred on the user's size class, spread over a quarter of the range.
            let c = lo.ln() + size_class * (hi.ln() - lo.ln());
            let w = 0.25 * (hi.ln() - lo.ln());
            (c + rng.random_range(-w..w)).exp().clamp(lo, hi)
        };
        let mut rec = JobRecord {
            job_id: format!("job-{i:05}"),
            kind: JobKind::Batch,
            submit_s: (t * 10.0).round() / 10.0,
            model: model.to_string(),
            user: format!("user-{user:02}"),
            tables: scale(&mut rng, 8.0, 48.0).round() as u32,
            rows_per_table: scale(&mut rng, 2e5, 2e7).round() as u64,
            emb_dim: [8, 16, 32, 64][urng.random_range(0..4)],
            dense_params: scale(&mut rng, 1e5, 2e7).round() as u64,
            samples: (log_uniform(&mut rng, 5e7, 1.5e9) / 1e6).round() as u64 * 1_000_000,
            batch_size: 512,
            peak_rate: 0.0,
            duration_s: 0.0,
            requested: placeholder(),
        };
        rec.requested = user_guess(&rec, spec.seed, &mut rng);
        out.push(rec);
    }
    for i in 0..spec.online_jobs {
        let user = rng.random_range(0..USERS);
        let mut rec = JobRecord {
            job_id: format!("stream-{i:03}"),
            kind: JobKind::Online,
            submit_s: 0.0,
            model: "mmoe".into(),
            user: format!("user-{user:02}"),
            tables: rng.random_range(16..40),
            rows_per_table: log_uniform(&mut rng, 1e6, 2e7).round() as u64,
            emb_dim: 16,
            dense_params: log_uniform(&mut rng, 1e6, 1e7).round() as u64,
            samples: 0,
            batch_size: 512,
            peak_rate: (log_uniform(&mut rng, 5e4, 4e5) / 1e3).round() * 1e3,
            duration_s: spec.online_h * 3600.0,
            requested: placeholder(),
        };
        rec.requested = user_guess(&rec, spec.seed, &mut rng);
        out.push(rec);
    }
    out
}

fn placeholder() -> Allocation {
    Allocation {
        workers: 1,
        ps: 1,
        worker_cpu: 1.0,
        ps_cpu: 1.0,
        worker_mem_gb: 1.0,
        ps_mem_gb: 1.0,
    }
}

/// The user's configuration: the well-tuned one, mis-scaled.
fn user_guess(rec: &JobRecord, seed: u64, rng: &mut impl Rng) -> Allocation {
    let truth = Truth::of(rec, &mut job_rng(seed, &rec.job_id));
    let tuned = truth.tuned();
    let w = (f64::from(tuned.workers) * log_uniform(rng, 0.25, 4.0)).round();
    let p = (f64::from(tuned.ps) * log_uniform(rng, 0.5, 2.0)).round();
    let ps = p.clamp(1.0, 32.0) as u32;
    let ps_mem = truth.state_gb * log_uniform(rng, 0.6, 2.0) / f64::from(ps);
    Allocation {
        workers: w.clamp(1.0, 64.0) as u32,
        ps,
        worker_cpu: tuned.worker_cpu,
        ps_cpu: tuned.ps_cpu,
        worker_mem_gb: tuned.worker_mem_gb,
        ps_mem_gb: (ps_mem * 10.0).ceil() / 10.0,
    }
    .clamp_mem()
}

trait ClampMem {
    fn clamp_mem(self) -> Self;
}

impl ClampMem for Allocation {
    fn clamp_mem(mut self) -> Self {
        self.ps_mem_gb = self.ps_mem_gb.clamp(2.0, 256.0);
        self
    }
}

/// Writes a trace as CSV ([`COLUMNS`]).
pub fn write_csv(path: &Path, jobs: &[JobRecord]) -> std::io::Result<()> {
    use std::fmt::Write as _;
    let mut s = COLUMNS.join(",");
    s.push('\n');
    for j in jobs {
        let a = &j.requested;
        let kind = match j.kind {
            JobKind::Batch => "batch",
            JobKind::Online => "online",
        };
        let _ = writeln!(
            s,
            "{},{kind},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            j.job_id,
            j.submit_s,
            j.model,
            j.user,
            j.tables,
            j.rows_per_table,
            j.emb_dim,
            j.dense_params,
            j.samples,
            j.batch_size,
            j.peak_rate,
            j.duration_s,
            a.workers,
            a.ps,
            a.worker_cpu,
            a.ps_cpu,
            a.worker_mem_gb,
            a.ps_mem_gb
        );
    }
    std::fs::write(path, s)
}

/// Reads a trace CSV: a header naming the [`COLUMNS`] (in any order; other columns are
/// ignored), then one job per line. Every error names the file, the line and the column.
pub fn read_csv(path: &Path) -> Result<Vec<JobRecord>, SimSetupError> {
    let text = std::fs::read_to_string(path).map_err(|e| SimSetupError::Trace {
        at: path.display().to_string(),
        reason: format!("cannot read it: {e}"),
    })?;
    parse_csv(&text, &path.display().to_string())
}

/// [`read_csv`] over text already read; `name` labels the errors.
pub fn parse_csv(text: &str, name: &str) -> Result<Vec<JobRecord>, SimSetupError> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let bad = |line: usize, reason: String| SimSetupError::Trace {
        at: format!("{name}:{}", line + 1),
        reason,
    };
    let Some((hl, header)) = lines.next() else {
        return Err(bad(0, "empty file: expected a header line".into()));
    };
    let names: Vec<&str> = header.split(',').map(str::trim).collect();
    let mut index = [0usize; COLUMNS.len()];
    for (k, col) in COLUMNS.iter().enumerate() {
        index[k] = names.iter().position(|n| n == col).ok_or_else(|| {
            bad(
                hl,
                format!(
                    "missing column `{col}` (the header must name: {})",
                    COLUMNS.join(",")
                ),
            )
        })?;
    }
    let mut out = Vec::new();
    let mut ids = std::collections::HashSet::new();
    for (ln, line) in lines {
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if fields.len() != names.len() {
            return Err(bad(
                ln,
                format!("{} fields, the header has {}", fields.len(), names.len()),
            ));
        }
        let get = |k: usize| fields[index[k]];
        let num = |k: usize| -> Result<f64, SimSetupError> {
            let v: f64 = get(k).parse().map_err(|_| {
                bad(
                    ln,
                    format!("column `{}`: `{}` is not a number", COLUMNS[k], get(k)),
                )
            })?;
            if !v.is_finite() || v < 0.0 {
                return Err(bad(
                    ln,
                    format!("column `{}`: {v} must be finite and >= 0", COLUMNS[k]),
                ));
            }
            Ok(v)
        };
        let positive = |k: usize| -> Result<f64, SimSetupError> {
            let v = num(k)?;
            if v == 0.0 {
                return Err(bad(ln, format!("column `{}`: must be > 0", COLUMNS[k])));
            }
            Ok(v)
        };
        let kind = match get(1) {
            "batch" => JobKind::Batch,
            "online" => JobKind::Online,
            other => {
                return Err(bad(
                    ln,
                    format!("column `kind`: `{other}` is neither `batch` nor `online`"),
                ))
            }
        };
        let id = get(0).to_string();
        if id.is_empty() || !ids.insert(id.clone()) {
            return Err(bad(
                ln,
                format!("column `job_id`: `{id}` is empty or repeated"),
            ));
        }
        let rec = JobRecord {
            job_id: id,
            kind,
            submit_s: num(2)?,
            model: get(3).to_string(),
            user: get(4).to_string(),
            tables: positive(5)? as u32,
            rows_per_table: positive(6)? as u64,
            emb_dim: positive(7)? as u32,
            dense_params: num(8)? as u64,
            samples: if kind == JobKind::Batch {
                positive(9)? as u64
            } else {
                num(9)? as u64
            },
            batch_size: positive(10)? as u32,
            peak_rate: if kind == JobKind::Online {
                positive(11)?
            } else {
                num(11)?
            },
            duration_s: if kind == JobKind::Online {
                positive(12)?
            } else {
                num(12)?
            },
            requested: Allocation {
                workers: positive(13)? as u32,
                ps: positive(14)? as u32,
                worker_cpu: positive(15)?,
                ps_cpu: positive(16)?,
                worker_mem_gb: positive(17)?,
                ps_mem_gb: positive(18)?,
            },
        };
        let b = elastrec_brain::Bounds::default();
        if !b.contains(&rec.requested) {
            return Err(bad(
                ln,
                format!(
                    "the requested configuration ({}) is outside the brain's bounds (workers 1..=64, PS 1..=32, 1..=32 cores, worker memory 2..=128 GiB, PS memory 2..=256 GiB)",
                    elastrec_brain::shared::describe(&rec.requested)
                ),
            ));
        }
        out.push(rec);
    }
    if out.is_empty() {
        return Err(bad(hl, "no job after the header".into()));
    }
    out.sort_by(|a, b| a.submit_s.total_cmp(&b.submit_s));
    Ok(out)
}
