//! What a job's settings resolve to before anything trains, computed the same way by every
//! process that builds a part of it (the trainer, the master, the parameter servers and the
//! workers): its data (generated when missing, rows counted per file), the rows of its
//! embedding tables and its dense model.

use std::path::PathBuf;

use elastrec_data::{GenSpec, OutputFormat, NUM_DENSE, NUM_SPARSE};
use elastrec_embedding::capped_rows;
use elastrec_model::{DenseDlrm, DlrmConfig};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::config::{JobConfig, ModelConfig, TableRows};
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

/// Per-table row counts for a job: explicit, or sized from the data's `report.json` as
/// `min(max_table_rows, max(ROWS_PER_VALUE · cardinality, MIN_AUTO_ROWS))`.
pub fn resolve_table_rows(job: &JobConfig) -> Vec<u64> {
    let cap = job.model.max_table_rows;
    match &job.model.table_rows {
        TableRows::All(n) => vec![(*n).min(cap); NUM_SPARSE],
        TableRows::PerTable(v) => capped_rows(v, cap),
        TableRows::Auto => match elastrec_data::gen::read_report(&job.data.dir) {
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

/// The dense DLRM configuration of a job's model section: 13 dense inputs in front of the
/// bottom MLP, one embedding vector per categorical feature. Every process (trainer,
/// parameter server, worker) builds its dense model from this, so shapes and initial
/// values agree.
pub fn dense_config(m: &ModelConfig) -> DlrmConfig {
    let mut bottom = vec![NUM_DENSE];
    bottom.extend_from_slice(&m.bottom_mlp);
    DlrmConfig {
        bottom,
        top: m.top_mlp.clone(),
        num_tables: NUM_SPARSE,
        embedding_dim: m.embedding_dim,
        interaction: m.interaction,
        seed: m.seed,
        adapt: m.adapt_mlp.clone(),
    }
}

/// Builds the dense DLRM of a job (same shapes and seed as the single-process trainer).
pub fn dense_model(job: &JobConfig) -> anyhow::Result<DenseDlrm> {
    Ok(DenseDlrm::new(dense_config(&job.model))?)
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
