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
