//! What a job's settings resolve to before anything trains, computed the same way by every
//! process that builds a part of it (the trainer, the master, the parameter servers and the
//! workers): its data (generated when missing, rows counted per file), the rows of its
//! embedding tables and its dense model.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use elastrec_data::{criteo, BatchReader, GenSpec, OutputFormat};
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
    let counts = row_counts(job, &files)?;
    some_rows(files, &counts)?;
    Ok(counts)
}

/// [`JobError::NoTrainingData`], naming the listed `files`, when the `counted` ones (all
/// of them, or the first of a long list) hold no row.
pub fn some_rows(files: Vec<PathBuf>, counted: &[(PathBuf, u64)]) -> Result<()> {
    if counted.iter().all(|&(_, rows)| rows == 0) {
        return Err(JobError::NoTrainingData {
            files,
            reason: "the data.train files hold 0 rows".into(),
        });
    }
    Ok(())
}

/// Each file with its row count (the sidecar index, built on first use and reused); a
/// named-feature job's text files start with a header that is not a row. Files are
/// counted in parallel: a job of many files waits on their footers and indexes.
pub fn row_counts(job: &JobConfig, files: &[PathBuf]) -> Result<Vec<(PathBuf, u64)>> {
    use rayon::prelude::*;
    let named = job.data.is_named();
    files
        .par_iter()
        .map(|f| Ok((f.clone(), elastrec_data::count_source_rows(f, named)?)))
        .collect()
}

/// Infers the features of a job that names only its label (`data.label` without
/// `[[data.feature]]`) from its first training file ([`elastrec_data::schema::infer`]),
/// and writes them into the job. Returns what was inferred (`None`: nothing to do).
///
/// Called once where a job starts, before anything reads the data, so the trainer, the
/// model file and a printed configuration all see one schema.
pub fn resolve_schema(job: &mut JobConfig) -> Result<Option<elastrec_data::schema::Inferred>> {
    if job.data.label.is_none() {
        return Ok(None);
    }
    if !job.data.feature.is_empty() {
        job.data.infer_user();
        return Ok(None);
    }
    let files = job.train_files();
    let Some(first) = files.first() else {
        return Err(JobError::NoTrainingData {
            files,
            reason: "data.label without [[data.feature]] infers the features from the first \
                     data.train file, and the job has none"
                .into(),
        });
    };
    let first = first.clone();
    infer_schema_from(job, &first).map(Some)
}

/// Infers the features of a job that names only its label from `file` (a training file,
/// or the log `elastrec replay` sends) and writes them into the job; its sample-weight
/// column is left out of the features.
pub fn infer_schema_from(
    job: &mut JobConfig,
    file: &Path,
) -> Result<elastrec_data::schema::Inferred> {
    let labels = job
        .data
        .label
        .as_ref()
        .map(|l| l.names())
        .unwrap_or_default();
    let mut inferred =
        elastrec_data::schema::infer(file, &labels, job.model.max_table_rows, &job.data.csv)?;
    if let Some(w) = &job.data.weight {
        // The weight column is no feature; neither is a table only it used.
        let s = &mut inferred.schema;
        s.features.retain(|f| f.column() != w);
        s.tables
            .retain(|t| s.features.iter().any(|f| f.table() == t.name));
        s.weight = Some(w.clone());
    }
    job.data.feature = inferred.schema.features.clone();
    job.data.table = inferred.schema.tables.clone();
    job.data.infer_user();
    Ok(inferred)
}

/// The job's named-feature schema, shared by its readers; `None` for the Criteo layout.
pub fn job_schema(job: &JobConfig) -> Option<Arc<elastrec_data::Schema>> {
    job.data.schema().map(Arc::new)
}

/// Rows the first pass of `model.dense_norm = "standardize"` reads at most, in equal
/// shares from the start of each training file it reads ([`DENSE_STATS_FILES`]): enough
/// for a mean and a deviation to three digits, and a bounded cost (about a second of
/// parsing) on any data set.
pub const DENSE_STATS_ROWS: u64 = 1_000_000;

/// Training files that pass reads at most, spread evenly over the job's files: its cost
/// stays the same however many files a job lists (opening each of 10,000 small Parquet
/// files made it 16 of a master's 17 s start-up), and the rows still come from the whole
/// range of the data, not from its first days.
pub const DENSE_STATS_FILES: usize = 64;

/// Decides `model.dense_norm = "auto"` (standardize when the job has training files,
/// else none) and fills `model.dense_mean` and `model.dense_std` when the job
/// standardizes its dense features and does not give them: each feature's
/// mean and standard deviation as the model sees it (after the readers' transform or the
/// job's `[[preprocess]]` graph) over up to [`DENSE_STATS_ROWS`] training rows. A
/// constant feature gets a deviation of 1 (it is shifted to 0, not blown up). Returns the
/// rows read; 0 when there was nothing to compute.
///
/// Called once where a job starts (`train`, and `run`'s master before it stores and
/// ships the job file), so every process and every model file of the job uses the same
/// values.
pub fn fill_dense_stats(job: &mut JobConfig) -> Result<u64> {
    use crate::config::DenseNorm;
    let files = job.train_files();
    let m = &mut job.model;
    let auto = m.dense_norm == DenseNorm::Auto;
    if auto {
        // Given statistics are a choice to standardize; no training files, a choice not to.
        m.dense_norm = if m.dense_mean.is_empty() && files.is_empty() {
            DenseNorm::None
        } else {
            DenseNorm::Standardize
        };
    }
    if m.dense_norm != DenseNorm::Standardize || !m.dense_mean.is_empty() {
        return Ok(0);
    }
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
    let schema = job_schema(job);
    let (width, _) = feature_widths(job);
    // Welford's update per feature, in f64: stable for features far from zero.
    let (mut mean, mut m2) = (vec![0.0f64; width], vec![0.0f64; width]);
    let mut rows = 0u64;
    let mut batch = elastrec_data::Batch::default();
    let sampled = stats_files(job, &files)?;
    let share = (DENSE_STATS_ROWS / sampled.len().max(1) as u64).max(1);
    for (file, end) in &sampled {
        let end = (*end).min(share);
        let mut reader = open_job_reader(
            plan.as_ref(),
            schema.as_ref(),
            file,
            0,
            end,
            job.data.on_bad_row,
        )?;
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
    if rows == 0 && auto {
        // Nothing to standardize from: the job's own check of its rows names the files.
        job.model.dense_norm = DenseNorm::None;
        return Ok(0);
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

/// The files the standardization pass reads, with the rows it may read of each: every
/// training file, or for a job of more than [`DENSE_STATS_FILES`], that many of those
/// with rows to train, evenly spaced. The validation slice (`train.validation`) is never
/// trained, so its rows do not shape the features either; without one only the sampled
/// files are counted (a job of many files starts without reading them all).
fn stats_files(job: &JobConfig, files: &[PathBuf]) -> Result<Vec<(PathBuf, u64)>> {
    if job.train.validation > 0.0 || files.len() <= DENSE_STATS_FILES {
        let counts = row_counts(job, files)?;
        let (trained, _) = crate::selection::split_validation(&counts, job.train.validation);
        return Ok(stats_sample(trained));
    }
    let mut counted = row_counts(job, &evenly_spaced(files))?;
    counted.retain(|(_, rows)| *rows > 0);
    Ok(counted)
}

/// Every training file with rows to train or, for a job of more than
/// [`DENSE_STATS_FILES`], that many of those, evenly spaced.
fn stats_sample(trained: Vec<(PathBuf, u64)>) -> Vec<(PathBuf, u64)> {
    if trained.len() <= DENSE_STATS_FILES {
        return trained;
    }
    let with_rows: Vec<_> = trained.into_iter().filter(|(_, end)| *end > 0).collect();
    if with_rows.len() <= DENSE_STATS_FILES {
        return with_rows;
    }
    evenly_spaced(&with_rows)
}

/// [`DENSE_STATS_FILES`] of `items` (more than that many), evenly spaced from the first.
fn evenly_spaced<T: Clone>(items: &[T]) -> Vec<T> {
    let n = items.len();
    (0..DENSE_STATS_FILES)
        .map(|i| items[i * n / DENSE_STATS_FILES].clone())
        .collect()
}

/// The batch size a job file that leaves it out gets on a large training set.
pub const AUTO_BATCH_SIZE: usize = 2048;
/// Steps an epoch makes at least with an automatic batch size (down to
/// [`MIN_AUTO_BATCH_SIZE`]).
pub const AUTO_STEPS_PER_EPOCH: u64 = 100;
/// The smallest automatic batch size.
pub const MIN_AUTO_BATCH_SIZE: usize = 32;

/// Decides the batch size of a job file that leaves it out (`train.batch_size_auto`):
/// [`AUTO_BATCH_SIZE`], or for a batch job whose epoch would make fewer than
/// [`AUTO_STEPS_PER_EPOCH`] steps of it, the largest power of two that still makes that
/// many (at least [`MIN_AUTO_BATCH_SIZE`]). The rows an epoch trains are the training
/// files' less the validation slice. Returns the batch size when it was made smaller.
///
/// Why: a model is trained by its steps. On a small training set, 2048 rows a step
/// leave the DLRM with 20 steps an epoch on the 39,073 rows of the public Adult data,
/// and below a logistic regression (0.889 AUC against 0.901); 256 rows a step reach
/// 0.905 (`docs/models.md`, "Real data"). A large training set keeps 2048, the batch the
/// speed figures are measured at. An online or following job keeps it too: its stream
/// has no end to count. Called once where a job starts, beside [`fill_dense_stats`].
pub fn fill_batch_size(job: &mut JobConfig) -> Result<Option<usize>> {
    if !std::mem::take(&mut job.train.batch_size_auto) {
        return Ok(None);
    }
    job.train.batch_size = AUTO_BATCH_SIZE;
    if job.stream.is_some() || job.data.follow {
        return Ok(None);
    }
    let files = job.train_files();
    if files.is_empty() {
        return Ok(None);
    }
    let large = AUTO_STEPS_PER_EPOCH * AUTO_BATCH_SIZE as u64;
    let trained = epoch_rows_up_to(job, &files, large)?;
    if trained >= large {
        return Ok(None);
    }
    let fits = (trained / AUTO_STEPS_PER_EPOCH).max(1);
    let batch = (1usize << fits.ilog2()).clamp(MIN_AUTO_BATCH_SIZE, AUTO_BATCH_SIZE);
    job.train.batch_size = batch;
    Ok(Some(batch))
}

/// The rows an epoch trains, as `train` and `run` split off the validation slice; without
/// one, counted a batch of files at a time only until they reach `enough` (a job of many
/// files starts without counting them all).
fn epoch_rows_up_to(job: &JobConfig, files: &[PathBuf], enough: u64) -> Result<u64> {
    if job.train.validation > 0.0 {
        let counts = row_counts(job, files)?;
        let (ends, _) = crate::selection::split_validation(&counts, job.train.validation);
        return Ok(ends.iter().map(|(_, end)| end).sum());
    }
    let mut rows = 0;
    for batch in files.chunks(DENSE_STATS_FILES) {
        rows += row_counts(job, batch)?.iter().map(|(_, r)| r).sum::<u64>();
        if rows >= enough {
            break;
        }
    }
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

/// Dense and single-id columns per row of the job's batches.
pub fn feature_widths(job: &JobConfig) -> (usize, usize) {
    if let Some(schema) = job.data.schema() {
        return (schema.dense_width(), schema.sparse_width());
    }
    match feature_plan(job) {
        Ok(Some(plan)) => (plan.dense_width(), plan.sparse_width()),
        // A graph that does not compile was refused when the job file was loaded.
        _ => (criteo::DENSE, criteo::CATEGORICAL),
    }
}

/// Opens `path` (rows `start..end`) through the job's `[[preprocess]]` plan, when it has
/// one ([`feature_plan`]), or its named features ([`job_schema`]).
pub fn open_job_reader(
    plan: Option<&Arc<Plan>>,
    schema: Option<&Arc<elastrec_data::Schema>>,
    path: &std::path::Path,
    start: u64,
    end: u64,
    policy: elastrec_data::BadRowPolicy,
) -> elastrec_data::Result<Box<dyn BatchReader>> {
    let reader = elastrec_data::open_source(path, Some((start, end)), policy, schema)?;
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
    if let Some(schema) = job.data.schema() {
        // Named features size their tables in [[data.table]] (or by inference).
        return schema.table_rows().iter().map(|&r| r.min(cap)).collect();
    }
    // A graph that does not compile was refused when the job file was loaded.
    let plan = feature_plan(job).ok().flatten();
    let sparse = plan
        .as_ref()
        .map_or(criteo::CATEGORICAL, |p| p.sparse_width());
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
            Ok(report) if report.cardinalities.len() == criteo::CATEGORICAL => {
                let sized: Vec<u64> = report
                    .cardinalities
                    .iter()
                    .map(|&c| (c.saturating_mul(ROWS_PER_VALUE)).max(MIN_AUTO_ROWS))
                    .collect();
                capped_rows(&sized, cap)
            }
            _ => vec![DEFAULT_TABLE_ROWS.min(cap); criteo::CATEGORICAL],
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
    // One embedding vector per slot: a named schema's bags and sequences pool into one.
    let slots = job.data.schema().map_or(sparse, |s| s.embedding_slots());
    let mut bottom = vec![dense];
    bottom.extend_from_slice(&m.bottom_mlp);
    DlrmConfig {
        bottom,
        top: m.top_mlp.clone(),
        num_tables: slots,
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
        batch_norm: m.batch_norm,
        mmoe: m.mmoe_settings().as_ref().map(mmoe_config),
        attention: job
            .data
            .schema()
            .map(|s| s.attention_slots())
            .unwrap_or_default()
            .into_iter()
            .map(
                |(slot, query, max_len, pooling)| elastrec_model::AttentionConfig {
                    slot,
                    query,
                    max_len,
                    mlp: m.attention.mlp.clone(),
                    softmax: m.attention.softmax,
                    transformer: (pooling == elastrec_data::schema::Pooling::Transformer)
                        .then(|| m.transformer.model_config(m.embedding_dim)),
                },
            )
            .collect(),
    }
}

/// The model's multi-task head from `[model.mmoe]`.
pub fn mmoe_config(h: &crate::config::MmoeSettings) -> elastrec_model::MmoeConfig {
    elastrec_model::MmoeConfig {
        tasks: h.tasks,
        experts: h.experts,
        expert: h.expert_mlp.clone(),
        weights: h.task_weights.clone(),
        task_experts: h.task_experts,
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

    /// A large training set keeps the default batch as soon as the files counted so far
    /// hold enough rows for 100 steps: the rest of a long list is not counted (here its
    /// last file does not even exist).
    #[test]
    fn a_large_training_set_keeps_the_default_batch_without_counting_every_file() {
        let dir = tempfile::tempdir().unwrap();
        let per_file = (AUTO_STEPS_PER_EPOCH * AUTO_BATCH_SIZE as u64) as usize / DENSE_STATS_FILES;
        let first = dir.path().join("part_0.tsv");
        std::fs::write(&first, (0..per_file as u32).map(line).collect::<String>()).unwrap();
        let mut job = JobConfig::from_toml("", std::path::Path::new("job.toml")).unwrap();
        job.data.dir = dir.path().to_path_buf();
        job.data.train = vec!["part_0.tsv".into()];
        for i in 1..DENSE_STATS_FILES {
            let name = format!("part_{i}.tsv");
            std::fs::hard_link(&first, dir.path().join(&name)).unwrap();
            job.data.train.push(name);
        }
        job.data.train.push("not_counted.tsv".into());
        assert_eq!(fill_batch_size(&mut job).unwrap(), None);
        assert_eq!(job.train.batch_size, AUTO_BATCH_SIZE);
    }

    /// A job file without a batch size gets 2048, or on a small training set the largest
    /// power of two that makes 100 steps an epoch (the validation slice not counted);
    /// a batch the file names, and an online job's, stand.
    #[test]
    fn a_small_training_set_gets_a_batch_of_at_least_100_steps_an_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let rows = |n: u32| (0..n).map(line).collect::<String>();
        std::fs::write(dir.path().join("a.tsv"), rows(30_000)).unwrap();
        std::fs::write(dir.path().join("b.tsv"), rows(9_073)).unwrap();
        let job = |text: &str| {
            let mut job = JobConfig::from_toml(text, std::path::Path::new("job.toml")).unwrap();
            job.data.dir = dir.path().to_path_buf();
            job.data.train = vec!["a.tsv".into(), "b.tsv".into()];
            job
        };
        // 39,073 rows: 390 a step would make 100 steps; 256 is the power of two below.
        let mut auto = job("");
        assert!(auto.train.batch_size_auto);
        assert_eq!(fill_batch_size(&mut auto).unwrap(), Some(256));
        assert_eq!(
            (auto.train.batch_size, auto.train.batch_size_auto),
            (256, false)
        );
        // Decided once: the stored job names its batch.
        assert_eq!(fill_batch_size(&mut auto).unwrap(), None);
        let stored = toml::to_string(&auto).unwrap();
        let again = JobConfig::from_toml(&stored, std::path::Path::new("job.toml")).unwrap();
        assert_eq!(
            (again.train.batch_size, again.train.batch_size_auto),
            (256, false)
        );
        // A validation slice of 49% leaves 19,927 rows: 128.
        let mut held = job("[train]\nvalidation = 0.49\n");
        assert_eq!(fill_batch_size(&mut held).unwrap(), Some(128));
        let mut named = job("[train]\nbatch_size = 2048\n");
        assert_eq!(fill_batch_size(&mut named).unwrap(), None);
        assert_eq!(named.train.batch_size, 2048);
        let mut tiny = job("");
        tiny.data.train = vec!["b.tsv".into()];
        std::fs::write(dir.path().join("b.tsv"), rows(500)).unwrap();
        assert_eq!(
            fill_batch_size(&mut tiny).unwrap(),
            Some(MIN_AUTO_BATCH_SIZE)
        );
        let mut online = job("");
        online.stream = Some(Default::default());
        assert_eq!(fill_batch_size(&mut online).unwrap(), None);
        assert_eq!(online.train.batch_size, AUTO_BATCH_SIZE);
    }

    /// A job listing many files standardizes from [`DENSE_STATS_FILES`] of them, evenly
    /// spaced over the whole list, and opens no other (here the others do not even
    /// exist): a start-up cost that does not grow with the list, and statistics of all of
    /// the data rather than of its first files.
    #[test]
    fn a_job_of_many_files_standardizes_from_files_spread_over_the_list() {
        let dir = tempfile::tempdir().unwrap();
        let files = 4 * DENSE_STATS_FILES as u32;
        let mut job = JobConfig::default();
        job.data.dir = dir.path().to_path_buf();
        job.data.train.clear();
        for i in 0..files {
            let name = format!("part_{i}.tsv");
            if i % 4 == 0 {
                std::fs::write(dir.path().join(&name), line(i) + &line(i)).unwrap();
            }
            job.data.train.push(name);
        }
        assert_eq!(
            fill_dense_stats(&mut job).unwrap(),
            2 * DENSE_STATS_FILES as u64,
            "two rows of each sampled file"
        );
        // Every fourth file: I1 = 0, 4, ..., 252.
        let sampled: Vec<f64> = (0..DENSE_STATS_FILES)
            .map(|k| (4.0 * k as f64).ln_1p())
            .collect();
        let mean = sampled.iter().sum::<f64>() / sampled.len() as f64;
        assert!(
            (job.model.dense_mean[0] as f64 - mean).abs() < 1e-5,
            "{} against {mean}",
            job.model.dense_mean[0]
        );
        let first_files = (0..DENSE_STATS_FILES)
            .map(|i| (i as f64).ln_1p())
            .sum::<f64>()
            / DENSE_STATS_FILES as f64;
        assert!(mean - first_files > 1.0, "the sample spans the whole list");
    }

    /// The first pass reads every file from its start and gives the mean and the
    /// population deviation of each feature as the model sees it (`ln(1 + x)`); constant
    /// features get deviation 1; values given in the job are kept. `auto`, the default,
    /// standardizes a job with training files and leaves a stream-only job as it is.
    #[test]
    fn dense_statistics_come_from_the_training_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.tsv"), line(0) + &line(1)).unwrap();
        std::fs::write(dir.path().join("b.tsv"), line(3)).unwrap();
        let mut job = JobConfig::default();
        job.data.dir = dir.path().to_path_buf();
        job.data.train = vec!["a.tsv".into(), "b.tsv".into()];
        let mut off = job.clone();
        off.model.dense_norm = DenseNorm::None;
        assert_eq!(fill_dense_stats(&mut off).unwrap(), 0, "none reads nothing");
        assert!(off.model.dense_mean.is_empty());
        assert_eq!(job.model.dense_norm, DenseNorm::Auto, "the default");
        assert_eq!(fill_dense_stats(&mut job).unwrap(), 3);
        assert_eq!(job.model.dense_norm, DenseNorm::Standardize, "auto decided");
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
        // The validation slice (here the last row, the 3 of b.tsv) is not read.
        let mut held = JobConfig {
            data: job.data.clone(),
            ..JobConfig::default()
        };
        held.train.validation = 1.0 / 3.0;
        assert_eq!(fill_dense_stats(&mut held).unwrap(), 2);
        let mean = (0f64.ln_1p() + 1f64.ln_1p()) / 2.0;
        assert!((held.model.dense_mean[0] as f64 - mean).abs() < 1e-6);
        // Given values stand: a second call reads nothing.
        let before = job.model.clone();
        assert_eq!(fill_dense_stats(&mut job).unwrap(), 0);
        assert_eq!(job.model, before);
        // A job without training files keeps its features by default, and is told what
        // to give when it asks to standardize.
        let mut stream_only = JobConfig::default();
        stream_only.data.train.clear();
        assert_eq!(fill_dense_stats(&mut stream_only).unwrap(), 0);
        assert_eq!(stream_only.model.dense_norm, DenseNorm::None);
        // Empty training files: nothing to standardize from under `auto` (the job's
        // check of its rows then names them); `standardize` says so itself.
        std::fs::write(dir.path().join("empty.tsv"), "").unwrap();
        let mut empty = JobConfig::default();
        empty.data.dir = dir.path().to_path_buf();
        empty.data.train = vec!["empty.tsv".into()];
        assert_eq!(fill_dense_stats(&mut empty.clone()).unwrap(), 0);
        empty.model.dense_norm = DenseNorm::Standardize;
        let e = fill_dense_stats(&mut empty).unwrap_err().to_string();
        assert!(e.contains("no row"), "{e}");
        stream_only.model.dense_norm = DenseNorm::Standardize;
        let e = fill_dense_stats(&mut stream_only).unwrap_err().to_string();
        assert!(e.contains("model.dense_mean and model.dense_std"), "{e}");
    }
}
