//! What a job's settings resolve to before anything trains, computed the same way by every
//! process that builds a part of it (the trainer, the master, the parameter servers and the
//! workers): its data (generated when missing, rows counted per file), the rows of its
//! embedding tables and its dense model.

use std::path::PathBuf;
use std::sync::Arc;

use elastrec_data::{BatchReader, GenSpec, OutputFormat, NUM_DENSE, NUM_SPARSE};
use elastrec_embedding::capped_rows;
use elastrec_model::{DenseDlrm, DlrmConfig};
use elastrec_preprocess::{Plan, PreprocessedReader};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::config::{JobConfig, TableRows};
use crate::error::{JobError, Result};

/// Rows per table when neither the job nor a data report says otherwise.
pub const DEFAULT_TABLE_ROWS: u64 = 100_000;

/// Generates the job's data if its directory is missing and the job says how.
pub fn ensure_data(job: &JobConfig, progress: bool) -> Result<()> {
    let Some(gen) = &job.data.generate else {
        return Ok(());
    };
    if job.data.dir.exists() {
        return Ok(());
    }
    let spec = GenSpec {
        out: job.data.dir.clone(),
        rows: gen.rows,
        format: OutputFormat::Tsv,
        seed: gen.seed,
        days: gen.days,
        scale: gen.scale,
        drift: gen.drift,
        conversions: gen.conversions,
    };
    let pb = progress_bar(progress, gen.rows, "generating");
    let report = elastrec_data::generate_with_progress(&spec, &|done| pb.set_position(done))?;
    pb.finish_and_clear();
    eprintln!(
        "generated {} rows in {} files under {} ({:.0} rows/s); teacher AUC {:.4}, click rate {:.3}",
        report.rows,
        report.files.len(),
        job.data.dir.display(),
        report.rows_per_sec,
        report.teacher_auc,
        report.click_rate
    );
    Ok(())
}

/// Rows of each training file (TSV: lines, Parquet: the footer's count), in job order.
///
/// Fails with [`JobError::NoTrainingData`], naming the files, when together they hold
/// no row: training would otherwise run zero steps and still report the AUC of an
/// untrained model. The standalone trainer calls this before it creates anything; the
/// distributed master needs the same per-file counts to cut its shards.
pub fn count_train_rows(job: &JobConfig) -> Result<Vec<(PathBuf, u64)>> {
    let files = job.train_files();
    let counts = files
        .iter()
        .map(|f| Ok((f.clone(), elastrec_data::count_rows(f)?)))
        .collect::<Result<Vec<_>>>()?;
    if counts.iter().all(|&(_, rows)| rows == 0) {
        return Err(JobError::NoTrainingData {
            files,
            reason: "the data.train files hold 0 rows".into(),
        });
    }
    Ok(counts)
}

/// Rows the first pass of `model.dense_norm = "standardize"` reads at most, in equal
/// shares from the start of each training file: enough for a mean and a deviation to
/// three digits, and a bounded cost (about a second of parsing) on any data set.
pub const DENSE_STATS_ROWS: u64 = 1_000_000;

/// Fills `model.dense_mean` and `model.dense_std` when the job standardizes its dense
/// features (`model.dense_norm = "standardize"`) and does not give them: each feature's
/// mean and standard deviation as the model sees it (after the readers' transform or the
/// job's `[[preprocess]]` graph) over up to [`DENSE_STATS_ROWS`] training rows. A
/// constant feature gets a deviation of 1 (it is shifted to 0, not blown up). Returns the
/// rows read; 0 when there was nothing to compute.
///
/// Called once where a job starts (`train`, and `run`'s master before it stores and
/// ships the job file), so every process and every model file of the job uses the same
/// values.
pub fn fill_dense_stats(job: &mut JobConfig) -> Result<u64> {
    let m = &job.model;
    if m.dense_norm != crate::config::DenseNorm::Standardize || !m.dense_mean.is_empty() {
        return Ok(0);
    }
    let files = job.train_files();
    if files.is_empty() {
        return Err(JobError::NoTrainingData {
            files,
            reason: "model.dense_norm = \"standardize\" computes its statistics from the \
                     data.train files, and the job has none; give model.dense_mean and \
                     model.dense_std (e.g. from a batch job over the same features)"
                .into(),
        });
    }
    let plan = feature_plan(job)?;
    let (width, _) = feature_widths(job);
    let share = (DENSE_STATS_ROWS / files.len() as u64).max(1);
    // Welford's update per feature, in f64: stable for features far from zero.
    let (mut mean, mut m2) = (vec![0.0f64; width], vec![0.0f64; width]);
    let mut rows = 0u64;
    let mut batch = elastrec_data::Batch::default();
    for file in &files {
        // The row count is the sidecar index `count_train_rows` builds (and reuses) anyway.
        let end = elastrec_data::count_rows(file)?.min(share);
        let mut reader = open_job_reader(plan.as_ref(), file, 0, end, job.data.on_bad_row)?;
        while reader.next_batch(&mut batch, 8192)? > 0 {
            for row in batch.dense.chunks_exact(width) {
                rows += 1;
                for ((mu, s), &x) in mean.iter_mut().zip(&mut m2).zip(row) {
                    let delta = x as f64 - *mu;
                    *mu += delta / rows as f64;
                    *s += delta * (x as f64 - *mu);
                }
            }
        }
    }
    if rows == 0 {
        return Err(JobError::NoTrainingData {
            files,
            reason: "no row to compute model.dense_norm's statistics from".into(),
        });
    }
    let m = &mut job.model;
    m.dense_mean = mean.iter().map(|&v| v as f32).collect();
    m.dense_std = m2
        .iter()
        .map(|&s| {
            let sd = (s / rows as f64).sqrt() as f32;
            if sd > 1e-6 {
                sd
            } else {
                1.0
            }
        })
        .collect();
    Ok(rows)
}

/// Hashed rows per distinct value when sizing tables from cardinalities.
///
/// At load factor 1 (rows = cardinality) about 63% of values share a row, including the
/// frequent ones of small tables, and those collisions cost real accuracy (measured on the
/// quickstart data: 83% of the teacher's AUC lift at factor 1, 95% at factor 4).
pub const ROWS_PER_VALUE: u64 = 4;
/// Smallest auto-sized table: tiny vocabularies get room so their values never collide.
pub const MIN_AUTO_ROWS: u64 = 1024;

/// The job's compiled `[[preprocess]]` graph; `None` for the default Criteo graph, which
/// the readers apply themselves (bit for bit the same, without a second pass).
pub fn feature_plan(job: &JobConfig) -> Result<Option<Arc<Plan>>> {
    if job.preprocess.is_empty() {
        return Ok(None);
    }
    Ok(Some(Arc::new(Plan::compile(&job.preprocess)?)))
}

/// Dense and sparse columns per row of the job's batches.
pub fn feature_widths(job: &JobConfig) -> (usize, usize) {
    match feature_plan(job) {
        Ok(Some(plan)) => (plan.dense_width(), plan.sparse_width()),
        // A graph that does not compile was refused when the job file was loaded.
        _ => (NUM_DENSE, NUM_SPARSE),
    }
}

/// Opens `path` (rows `start..end`) through the job's `[[preprocess]]` plan, when it has
/// one ([`feature_plan`]).
pub fn open_job_reader(
    plan: Option<&Arc<Plan>>,
    path: &std::path::Path,
    start: u64,
    end: u64,
    policy: elastrec_data::BadRowPolicy,
) -> elastrec_data::Result<Box<dyn BatchReader>> {
    let reader = elastrec_data::open_reader_range(path, start, end, policy)?;
    Ok(preprocessed(reader, plan))
}

/// `reader` through `plan` when there is one.
pub fn preprocessed(
    reader: Box<dyn BatchReader>,
    plan: Option<&Arc<Plan>>,
) -> Box<dyn BatchReader> {
    match plan {
        Some(plan) => Box::new(PreprocessedReader::new(reader, Arc::clone(plan))),
        None => reader,
    }
}

/// What each table's ids hash over: its [`resolve_table_rows`], or with
/// `[model.dynamic_embeddings]` the whole key space of a dynamic table (whose rows are then
/// its memory budget). What a process routing ids to parameter servers uses.
pub fn resolve_key_spaces(job: &JobConfig) -> Vec<u64> {
    elastrec_embedding::EmbeddingConfig {
        dynamic: job.model.dynamic_embeddings,
        ..elastrec_embedding::EmbeddingConfig::with_rows(resolve_table_rows(job))
    }
    .key_spaces()
}

/// Per-table row counts for a job: explicit, or sized from the data's `report.json` as
/// `min(max_table_rows, max(ROWS_PER_VALUE · cardinality, MIN_AUTO_ROWS))`.
///
/// With a `[[preprocess]]` graph, `auto` sizes each sparse column from its entry: its
/// `rows` when given, else the ids its chain can produce (a `sigrid_hash` mod, a bucket
/// count) as a cardinality, else the report's cardinality of the raw `C` column it
/// keeps, else the default size.
pub fn resolve_table_rows(job: &JobConfig) -> Vec<u64> {
    let cap = job.model.max_table_rows;
    // A graph that does not compile was refused when the job file was loaded.
    let plan = feature_plan(job).ok().flatten();
    let sparse = plan.as_ref().map_or(NUM_SPARSE, |p| p.sparse_width());
    match (&job.model.table_rows, plan) {
        (TableRows::All(n), _) => vec![(*n).min(cap); sparse],
        (TableRows::PerTable(v), _) => capped_rows(v, cap),
        (TableRows::Auto, Some(plan)) => {
            let report = elastrec_data::gen::read_report(&job.data.dir).ok();
            let sized = |c: u64| c.saturating_mul(ROWS_PER_VALUE).max(MIN_AUTO_ROWS).min(cap);
            plan.table_sizes()
                .into_iter()
                .map(|t| {
                    let from_data = t
                        .raw_column
                        .and_then(|c| report.as_ref()?.cardinalities.get(c).copied());
                    match (t.rows, t.cardinality.or(from_data)) {
                        (Some(rows), _) => rows.min(cap),
                        (None, Some(c)) => sized(c),
                        (None, None) => DEFAULT_TABLE_ROWS.min(cap),
                    }
                })
                .collect()
        }
        (TableRows::Auto, None) => match elastrec_data::gen::read_report(&job.data.dir) {
            Ok(report) if report.cardinalities.len() == NUM_SPARSE => {
                let sized: Vec<u64> = report
                    .cardinalities
                    .iter()
                    .map(|&c| (c.saturating_mul(ROWS_PER_VALUE)).max(MIN_AUTO_ROWS))
                    .collect();
                capped_rows(&sized, cap)
            }
            _ => vec![DEFAULT_TABLE_ROWS.min(cap); NUM_SPARSE],
        },
    }
}

/// The dense DLRM configuration of a job: its dense features (13 by default) in front of
/// the bottom MLP, one embedding vector per sparse feature column (26 by default). Every
/// process (trainer, parameter server, worker) builds its dense model from this, so
/// shapes and initial values agree.
pub fn dense_config(job: &JobConfig) -> DlrmConfig {
    let m = &job.model;
    let (dense, sparse) = feature_widths(job);
    let mut bottom = vec![dense];
    bottom.extend_from_slice(&m.bottom_mlp);
    DlrmConfig {
        bottom,
        top: m.top_mlp.clone(),
        num_tables: sparse,
        embedding_dim: m.embedding_dim,
        interaction: m.interaction,
        seed: m.seed,
        adapt: m.adapt_mlp.clone(),
        cross_layers: m.cross_layers(),
        fm: m.model_type == crate::config::ModelType::DeepFm,
        dense_shift: m.dense_mean.clone(),
        dense_scale: m.dense_std.iter().map(|s| 1.0 / s).collect(),
        dropout: m.dropout,
        first_order: m.has_first_order(),
        layer_norm: m.layer_norm,
        mmoe: m.mmoe_settings().as_ref().map(mmoe_config),
    }
}

/// The model's multi-task head from `[model.mmoe]`.
pub fn mmoe_config(h: &crate::config::MmoeSettings) -> elastrec_model::MmoeConfig {
    elastrec_model::MmoeConfig {
        tasks: h.tasks,
        experts: h.experts,
        expert: h.expert_mlp.clone(),
        weights: h.task_weights.clone(),
    }
}

/// Builds the dense DLRM of a job (same shapes and seed as the single-process trainer).
pub fn dense_model(job: &JobConfig) -> anyhow::Result<DenseDlrm> {
    Ok(DenseDlrm::new(dense_config(job))?)
}

/// The progress bar of a long step of a job (`what` names it), drawn on stderr when
/// `enabled`, else hidden.
pub fn progress_bar(enabled: bool, total: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(
        Some(total),
        if enabled {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        },
    );
    pb.set_style(
        ProgressStyle::with_template(&format!(
            "{what} [{{elapsed_precise}}] {{wide_bar}} {{pos}}/{{len}} ({{per_sec}}, eta {{eta}}) {{msg}}"
        ))
        .expect("valid template"),
    );
    pb
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DenseNorm;

    /// A Criteo TSV line with dense feature `I1 = i1`, `I2 = 5` and the rest empty.
    fn line(i1: u32) -> String {
        let mut f = vec!["1".to_string(), i1.to_string(), "5".to_string()];
        f.extend((0..11).map(|_| String::new()));
        f.extend((0..26).map(|_| "0a1b2c3d".to_string()));
        f.join("\t") + "\n"
    }

    /// The first pass reads every file from its start and gives the mean and the
    /// population deviation of each feature as the model sees it (`ln(1 + x)`); constant
    /// features get deviation 1; values given in the job are kept.
    #[test]
    fn dense_statistics_come_from_the_training_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.tsv"), line(0) + &line(1)).unwrap();
        std::fs::write(dir.path().join("b.tsv"), line(3)).unwrap();
        let mut job = JobConfig::default();
        job.data.dir = dir.path().to_path_buf();
        job.data.train = vec!["a.tsv".into(), "b.tsv".into()];
        assert_eq!(fill_dense_stats(&mut job).unwrap(), 0, "off by default");
        job.model.dense_norm = DenseNorm::Standardize;
        assert_eq!(fill_dense_stats(&mut job).unwrap(), 3);
        let xs = [0f64, 1.0, 3.0].map(|v: f64| v.ln_1p());
        let mean = xs.iter().sum::<f64>() / 3.0;
        let sd = (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 3.0).sqrt();
        let m = &job.model;
        assert!((m.dense_mean[0] as f64 - mean).abs() < 1e-6);
        assert!((m.dense_std[0] as f64 - sd).abs() < 1e-6);
        assert!((m.dense_mean[1] as f64 - 6f64.ln()).abs() < 1e-6);
        assert_eq!(
            (m.dense_std[1], m.dense_std[12], m.dense_mean[12]),
            (1.0, 1.0, 0.0)
        );
        // Given values stand: a second call reads nothing.
        let before = job.model.clone();
        assert_eq!(fill_dense_stats(&mut job).unwrap(), 0);
        assert_eq!(job.model, before);
        // A job without training files is told what to give instead.
        let mut stream_only = JobConfig::default();
        stream_only.model.dense_norm = DenseNorm::Standardize;
        stream_only.data.train.clear();
        let e = fill_dense_stats(&mut stream_only).unwrap_err().to_string();
        assert!(e.contains("model.dense_mean and model.dense_std"), "{e}");
    }
}
