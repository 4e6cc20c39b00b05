//! `elastrec bench`: training throughput of the Criteo-Kaggle-shaped DLRM.
//!
//! Model: bottom MLP 13-512-256-64-16, 26 tables of dimension 16 (Criteo Kaggle
//! cardinalities capped at `max_table_rows`), dot interaction, top MLP 512-256-1,
//! row-wise Adagrad for embeddings and Adagrad for the dense part. Measured:
//! - training samples/s with every batch already parsed in memory;
//! - training samples/s reading the same files through the prefetching reader;
//! - the dense part alone (forward + backward + Adagrad) in GFLOP/s, against the machine's
//!   SGEMM peak measured in the same run with the same GEMM library and threads;
//! - embedding-store bytes against the raw bytes of rows + optimizer state, and the
//!   process's peak resident memory.

use std::path::{Path, PathBuf};
use std::time::Instant;

use elastrec_data::{criteo, Batch, GenSpec, OutputFormat};
use elastrec_embedding::{capped_rows, CRITEO_KAGGLE_CARDINALITIES};
use elastrec_job::config::{JobConfig, TableRows};
use serde::Serialize;

use crate::error::Result;
use crate::step::{Dlrm, TrainStep};
use crate::trainer::{load_eval_set, Prefetcher};

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Timed steps per variant (after warm-up).
    pub steps: usize,
    /// Untimed steps first.
    pub warmup: usize,
    /// Samples per step.
    pub batch_size: usize,
    /// Cap on every table's rows.
    pub max_table_rows: u64,
    /// Directory of the benchmark data (generated when missing).
    pub data_dir: PathBuf,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self {
            steps: 30,
            warmup: 5,
            batch_size: 2048,
            max_table_rows: 1_000_000,
            data_dir: PathBuf::from("data/bench"),
        }
    }
}

/// Results, printed as a table or JSON by the CLI.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// Math threads.
    pub threads: usize,
    /// Samples per step.
    pub batch_size: usize,
    /// Timed steps per variant.
    pub steps: usize,
    /// Full training step, batches in memory.
    pub in_memory_samples_per_s: f64,
    /// Full training step, batches read from TSV files by the prefetching reader.
    pub from_files_samples_per_s: f64,
    /// Dense part alone (forward + backward + Adagrad), samples/s.
    pub dense_samples_per_s: f64,
    /// Dense FLOPs per sample (forward + backward GEMMs and interaction).
    pub dense_flops_per_sample: u64,
    /// Dense part's achieved GFLOP/s.
    pub dense_gflops: f64,
    /// SGEMM peak of this machine measured in the same run (same library, same threads).
    pub gemm_peak_gflops: f64,
    /// `dense_gflops / gemm_peak_gflops`.
    pub dense_fraction_of_peak: f64,
    /// Embedding store bytes (arenas plus bookkeeping).
    pub embedding_bytes: u64,
    /// Raw bytes of rows and optimizer state.
    pub embedding_raw_bytes: u64,
    /// `embedding_bytes / embedding_raw_bytes - 1`.
    pub embedding_overhead: f64,
    /// Peak resident memory of the process (VmHWM), bytes.
    pub peak_rss_bytes: Option<u64>,
    /// Rows per table used.
    pub table_rows: Vec<u64>,
}

/// The benchmark's job: the Criteo-Kaggle model with the documented optimizers.
pub fn bench_job(opts: &BenchOptions) -> JobConfig {
    let mut job = JobConfig::default();
    job.train.batch_size = opts.batch_size;
    job.model.table_rows = TableRows::PerTable(CRITEO_KAGGLE_CARDINALITIES.to_vec());
    job.model.max_table_rows = opts.max_table_rows;
    job.data.dir = opts.data_dir.clone();
    job.data.train = vec!["day_0.tsv".into(), "day_1.tsv".into()];
    job.data.eval = vec![];
    job
}

/// Generates the benchmark data (full Criteo Kaggle cardinalities) if missing.
pub fn ensure_bench_data(opts: &BenchOptions) -> Result<Vec<PathBuf>> {
    let files: Vec<PathBuf> = (0..2)
        .map(|d| opts.data_dir.join(format!("day_{d}.tsv")))
        .collect();
    let rows_needed = ((opts.steps + opts.warmup) * opts.batch_size) as u64;
    let enough = elastrec_data::gen::read_report(&opts.data_dir)
        .map(|r| r.rows >= rows_needed && files.iter().all(|f| f.exists()))
        .unwrap_or(false);
    if !enough {
        elastrec_data::generate(&GenSpec {
            out: opts.data_dir.clone(),
            rows: rows_needed.max(100_000),
            format: OutputFormat::Tsv,
            seed: 7,
            days: 2,
            scale: 1.0,
            drift: 0.0,
            conversions: false,
        })?;
    }
    Ok(files)
}

/// Runs every measurement.
pub fn run(opts: &BenchOptions, data: &BenchData) -> Result<BenchReport> {
    let (job, table_rows) = (&data.job, &data.table_rows);
    let total = opts.steps + opts.warmup;

    // Full step, in memory.
    let in_memory = in_memory_samples_per_s(opts, data)?;

    // Full step, from files (fresh model so both variants do the same work).
    let mut step = TrainStep::new(
        Dlrm::new(job, table_rows.clone())?,
        &job.optimizer.dense,
        opts.batch_size,
    );
    let files = data
        .files
        .iter()
        .map(|f| crate::mixing::Segment::whole(f.clone()))
        .collect();
    let reader = Prefetcher::start(files, job);
    let mut done = 0;
    let mut t0 = Instant::now();
    while done < total {
        let Some(b) = reader.next() else { break };
        let b = b?;
        if done == opts.warmup {
            t0 = Instant::now();
        }
        step.train_batch(&b)?;
        reader.recycle(b);
        done += 1;
    }
    let timed = done.saturating_sub(opts.warmup);
    let from_files = (timed * opts.batch_size) as f64 / t0.elapsed().as_secs_f64();
    drop(reader.finish());

    // Dense part alone.
    let (dense_sps, flops) = dense_only(job, &data.batches, opts)?;
    let dense_gflops = dense_sps * flops as f64 / 1e9;
    let peak = gemm_peak_gflops(2048, 8);

    let emb = &step.model.embeddings;
    let (bytes, raw) = (emb.memory_bytes() as u64, emb.raw_bytes() as u64);
    Ok(BenchReport {
        threads: rayon::current_num_threads(),
        batch_size: opts.batch_size,
        steps: opts.steps,
        in_memory_samples_per_s: in_memory,
        from_files_samples_per_s: from_files,
        dense_samples_per_s: dense_sps,
        dense_flops_per_sample: flops,
        dense_gflops,
        gemm_peak_gflops: peak,
        dense_fraction_of_peak: dense_gflops / peak,
        embedding_bytes: bytes,
        embedding_raw_bytes: raw,
        embedding_overhead: bytes as f64 / raw as f64 - 1.0,
        peak_rss_bytes: peak_rss(),
        table_rows: table_rows.clone(),
    })
}

/// Training samples/s of the full step on in-memory batches (a fresh model), measured
/// again: `elastrec bench --pytorch` interleaves this with the PyTorch reference.
pub fn in_memory_samples_per_s(opts: &BenchOptions, data: &BenchData) -> Result<f64> {
    let job = &data.job;
    let mut step = TrainStep::new(
        Dlrm::new(job, data.table_rows.clone())?,
        &job.optimizer.dense,
        opts.batch_size,
    );
    let total = opts.steps + opts.warmup;
    let mut t0 = Instant::now();
    for i in 0..total {
        if i == opts.warmup {
            t0 = Instant::now();
        }
        step.train_batch(&data.batches[i % data.batches.len()])?;
    }
    Ok((opts.steps * opts.batch_size) as f64 / t0.elapsed().as_secs_f64())
}

/// What every measurement reads, loaded once: the benchmark's files (generated when
/// missing), job, table sizes and the full batches held in memory.
pub struct BenchData {
    files: Vec<PathBuf>,
    job: JobConfig,
    table_rows: Vec<u64>,
    batches: Vec<Batch>,
}

/// Loads (and first generates, if missing) the benchmark's data.
pub fn prepare(opts: &BenchOptions) -> Result<BenchData> {
    let files = ensure_bench_data(opts)?;
    let job = bench_job(opts);
    let table_rows = capped_rows(&CRITEO_KAGGLE_CARDINALITIES, opts.max_table_rows);
    let mut stats = Default::default();
    let batches: Vec<Batch> = load_eval_set(&files, &job, &mut stats)?
        .into_iter()
        .filter(|b| b.len() == opts.batch_size)
        .collect();
    Ok(BenchData {
        files,
        job,
        table_rows,
        batches,
    })
}

/// Dense forward + backward + Adagrad on fixed embedding inputs: samples/s and FLOPs/sample.
fn dense_only(job: &JobConfig, batches: &[Batch], opts: &BenchOptions) -> Result<(f64, u64)> {
    let model = Dlrm::new(job, vec![1; criteo::CATEGORICAL])?;
    let mut dense = model.dense;
    let mut opt = job
        .optimizer
        .dense
        .build_with_statistics(dense.num_params(), dense.statistic_ranges());
    let mut ws = dense.workspace(opts.batch_size);
    let emb: Vec<f32> = (0..opts.batch_size * criteo::CATEGORICAL * model.embeddings.dim())
        .map(|i| ((i % 97) as f32 - 48.0) * 1e-3)
        .collect();
    let total = opts.steps + opts.warmup;
    let mut t0 = Instant::now();
    for i in 0..total {
        if i == opts.warmup {
            t0 = Instant::now();
        }
        let b = &batches[i % batches.len()];
        dense.forward_backward(&b.dense, &emb, &b.labels, &mut ws)?;
        opt.step(dense.params_mut(), ws.grads());
    }
    let sps = (opts.steps * opts.batch_size) as f64 / t0.elapsed().as_secs_f64();
    Ok((sps, dense.flops_per_sample().total()))
}

/// SGEMM GFLOP/s on `n x n` matrices (best of `reps`), through the GEMM backend and thread
/// pool the dense kernels use: the ceiling the dense part is compared with.
pub fn gemm_peak_gflops(n: usize, reps: usize) -> f64 {
    let a: Vec<f32> = (0..n * n).map(|i| (i % 13) as f32 * 0.01).collect();
    let b = a.clone();
    let mut c = vec![0.0f32; n * n];
    let mut best = f64::MAX;
    for _ in 0..reps.max(1) {
        let t0 = Instant::now();
        elastrec_model::gemm::matmul(&a, &b, &mut c, n, n, n);
        best = best.min(t0.elapsed().as_secs_f64());
    }
    2.0 * (n as f64).powi(3) / best / 1e9
}

/// Peak resident set size of this process (Linux `VmHWM`).
pub fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Path of the first benchmark file (the PyTorch reference reads the same rows).
pub fn first_file(opts: &BenchOptions) -> PathBuf {
    Path::new(&opts.data_dir).join("day_0.tsv")
}
