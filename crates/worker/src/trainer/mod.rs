//! The single-process trainer behind `elastrec train`: the standalone mode of elastrec.
//!
//! Reading runs on its own thread and hands parsed batches over a bounded channel (buffers
//! go back on a second channel, so steady state allocates nothing); the math uses every
//! core through rayon. Held-out files are parsed once and kept in memory for the periodic
//! evaluations (exact AUC over the whole held-out set, not an approximation).

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::time::Instant;

pub use elastrec_common::EvalResult;
use elastrec_data::{Batch, BatchReader, RawColumns, ReadStats};
use elastrec_job::config::{JobConfig, PreprocessOn};
use elastrec_job::prepare::{count_train_rows, ensure_data, progress_bar, resolve_table_rows};
use elastrec_job::JobError;
use elastrec_metrics::tensorboard::EventWriter;
use elastrec_model::EvalAccumulator;
use indicatif::ProgressBar;
use serde::Serialize;

use crate::error::{Result, WorkerError};
use crate::mixing::{Segment, SourceFile};
use crate::model_file;
use crate::placement::{Costs, Ewma, Placement};
use crate::selection::{Best, Selection, Verdict};
use crate::shuffle::Shuffler;
use crate::step::{Dlrm, Predictor, TrainStep};
use elastrec_common::splitmix::GOLDEN_GAMMA;
use elastrec_preprocess::Plan;
use parking_lot::Mutex;

mod evaluation;
mod prefetch;

pub use evaluation::{evaluate, evaluate_tasks, evaluate_tasks_each, load_eval_set, load_slice};
use evaluation::{Concluded, Evaluations, MetricsLog};
pub(crate) use prefetch::Prefetcher;
pub use prefetch::PreprocessReport;

/// Batches in flight between the reader thread and the trainer.
const PREFETCH: usize = 4;

/// Final figures of a training run, also written to `summary.json`.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Training samples processed (all epochs).
    pub samples: u64,
    /// Optimizer steps.
    pub steps: u64,
    /// Epochs run.
    pub epochs: u32,
    /// Training throughput over time spent training (evaluation excluded).
    pub samples_per_s: f64,
    /// Mean training loss of the last epoch.
    pub train_loss: f64,
    /// Last held-out evaluation (task 0's of a multi-task model).
    pub eval: Option<EvalResult>,
    /// A multi-task model's `eval` for every task, task 0 first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_evals: Option<Vec<EvalResult>>,
    /// The generator's teacher AUC for this data, when a `report.json` is present: the
    /// ceiling a model can approach.
    pub teacher_auc: Option<f64>,
    /// Wall time of the whole run, seconds (data loading and evaluation included).
    pub wall_s: f64,
    /// Math threads used.
    pub threads: usize,
    /// Rows per embedding table (with dynamic tables, each one's budget).
    pub table_rows: Vec<u64>,
    /// Bytes the embedding tables hold (rows, optimizer state, maps).
    pub embedding_bytes: u64,
    /// With `[model.dynamic_embeddings]`: rows stored, admitted, evicted, filtered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dynamic_embeddings: Option<elastrec_embedding::DynamicSummary>,
    /// Malformed rows skipped (with `on_bad_row = "skip"`).
    pub rows_skipped: u64,
    /// The first skip messages.
    pub skipped_examples: Vec<String>,
    /// Named features: lists (bags, sequences) cut to their `max_len`.
    #[serde(skip_serializing_if = "is_zero")]
    pub lists_truncated: u64,
    /// Named features: null items dropped from lists.
    #[serde(skip_serializing_if = "is_zero")]
    pub list_nulls: u64,
    /// Where the model was saved.
    pub model_path: Option<PathBuf>,
    /// With a `[[preprocess]]` graph: where the plan ran and what it cost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preprocess: Option<PreprocessReport>,
    /// With `train.validation` or `train.early_stopping`: the evaluation that selected the
    /// kept model (`eval` and `model.bin` are that model's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best: Option<Best>,
    /// With `train.validation`: the kept model on the validation slice.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub validation: Option<EvalResult>,
    /// Training stopped early (`train.early_stopping`).
    pub early_stopped: bool,
    /// With several `[[data.source]]`s: how they were served, and the rows each gave
    /// per epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mix: Option<serde_json::Value>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// The segments one epoch reads, from the training files cut by the validation slice
/// (`(file, rows read)`, beside `counts`, each file's rows): the files in order, whole
/// files as they are and a file cut short by row range; with several `[[data.source]]`s,
/// chunks dealt by the job's serving policy ([`crate::mixing`]), and what each source
/// gave, for the summary.
fn read_order(
    job: &JobConfig,
    train_files: Vec<(PathBuf, u64)>,
    counts: &[(PathBuf, u64)],
) -> (Vec<Segment>, Option<serde_json::Value>) {
    if job.data.source.len() < 2 {
        let segments = train_files
            .into_iter()
            .zip(counts)
            .filter(|((_, end), _)| *end > 0)
            .map(|((path, end), (_, rows))| Segment {
                path,
                start: 0,
                end: if end == *rows { u64::MAX } else { end },
            })
            .collect();
        return (segments, None);
    }
    let files: Vec<SourceFile> = train_files
        .into_iter()
        .zip(elastrec_job::mix::train_file_sources(job))
        .map(|((path, rows), source)| SourceFile { path, rows, source })
        .collect();
    let serving = elastrec_job::mix::serving(job);
    let chunk = job.train.batch_size as u64 * job.cluster.batches_per_shard as u64;
    let (segments, served) =
        crate::mixing::interleave(&files, job.data.source.len(), serving.clone(), chunk);
    let served: serde_json::Map<String, serde_json::Value> = job
        .data
        .source
        .iter()
        .zip(&served)
        .map(|(s, served)| (s.name.clone(), serde_json::json!(served)))
        .collect();
    let mix = serde_json::json!({
        "serving": serving.to_string(),
        "sources": job.data.source.iter().map(|s| &s.name).collect::<Vec<_>>(),
        "served_per_epoch": served,
        "chunk_rows": chunk,
    });
    (segments, Some(mix))
}

/// The batches one epoch trains: the reader's, or drawn from a shuffle buffer
/// (`train.shuffle_buffer`) that the reader's batches fill.
struct Feed {
    reader: Prefetcher,
    shuffler: Option<Shuffler>,
    /// The files are read: the buffer hands out what it holds.
    draining: bool,
    /// A shuffled batch's buffer, back from the trainer.
    spare: Option<Batch>,
    rows: usize,
}

impl Feed {
    fn new(reader: Prefetcher, job: &JobConfig, epoch: u32) -> Self {
        // A different order each epoch, the same for every run of the job.
        let seed = job.model.seed ^ (u64::from(epoch) + 1).wrapping_mul(GOLDEN_GAMMA);
        Self {
            reader,
            shuffler: (job.train.shuffle_buffer > 0)
                .then(|| Shuffler::new(job.train.shuffle_buffer, seed)),
            draining: false,
            spare: None,
            rows: job.train.batch_size,
        }
    }

    fn next(&mut self) -> Option<Result<Batch>> {
        let Some(shuffler) = self.shuffler.as_mut() else {
            return self.reader.next();
        };
        let mut out = self.spare.take().unwrap_or_default();
        loop {
            if shuffler.pop(self.rows, &mut out, self.draining).is_some() {
                return Some(Ok(out));
            }
            if self.draining {
                return None;
            }
            match self.reader.next() {
                Some(Ok(b)) => {
                    shuffler.push(&b);
                    self.reader.recycle(b);
                }
                Some(Err(e)) => return Some(Err(e)),
                None => self.draining = true,
            }
        }
    }

    /// Stops the reader: its preprocessing placement report (when it has one) and its
    /// read statistics join the run's.
    fn finish(self, preprocess: &mut Option<PreprocessReport>, stats: &mut ReadStats) {
        *preprocess = self.reader.preprocess_report().or(preprocess.take());
        stats.merge(&self.reader.finish());
    }

    fn recycle(&mut self, batch: Batch) {
        if self.shuffler.is_some() {
            self.spare = Some(batch);
        } else {
            self.reader.recycle(batch);
        }
    }
}

/// Where the loop stands when it evaluates.
struct Position {
    epoch: u32,
    samples: u64,
    steps: u64,
    /// Sum of per-sample losses and samples so far in this epoch.
    loss: (f64, u64),
    /// Seconds spent training (evaluation excluded).
    train_time: f64,
}

/// The job as trained: its datasets resolved, its files checked, its schema inferred
/// where the job leaves it open, dense statistics and an automatic batch size filled in
/// (each said on stderr).
fn prepared(job: &JobConfig) -> Result<JobConfig> {
    let mut job = job.clone();
    for line in
        elastrec_job::datasets::describe(&elastrec_job::datasets::resolve_datasets(&mut job)?)
    {
        eprintln!("data: {line}");
    }
    // Missing files are named before the first pass over them reads anything.
    for f in job.train_files().iter().chain(job.eval_files().iter()) {
        if !f.exists() {
            return Err(WorkerError::io(
                f,
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "data file not found; check data.dir and data.train/data.eval, or add [data.generate]",
                ),
            ));
        }
    }
    if let Some(inferred) = elastrec_job::prepare::resolve_schema(&mut job)? {
        let s = &inferred.schema;
        eprintln!(
            "data: features inferred from {} sampled rows: {} dense, {} categorical, {} lists \
             (`elastrec train --print-config` shows them)",
            inferred.sampled_rows,
            s.dense().count(),
            s.sparse_width(),
            s.lists().count()
        );
        for (column, why) in &inferred.skipped {
            eprintln!("data: column {column:?} left out ({why})");
        }
    }
    let stats_rows = elastrec_job::prepare::fill_dense_stats(&mut job)?;
    if stats_rows > 0 {
        eprintln!(
            "model: dense features standardized with statistics of {stats_rows} training rows"
        );
    }
    if let Some(batch) = elastrec_job::prepare::fill_batch_size(&mut job)? {
        eprintln!(
            "train: a small training set: batch size {batch} (for at least {} steps an epoch; \
             set train.batch_size to choose)",
            elastrec_job::prepare::AUTO_STEPS_PER_EPOCH
        );
    }
    Ok(job)
}

/// Trains the job in this process and returns its summary (also written to
/// `<output.dir>/summary.json`).
pub fn train(job: &JobConfig) -> Result<Summary> {
    let started = Instant::now();
    let progress = job.train.progress;
    ensure_data(job, progress)?;
    let job = &prepared(job)?;
    let counts = count_train_rows(job)?;
    let (train_files, slice) = crate::selection::split_validation(&counts, job.train.validation);
    let (train_segments, mix) = read_order(job, train_files, &counts);
    let train_rows: u64 = counts.iter().map(|&(_, rows)| rows).sum::<u64>()
        - slice.iter().map(|(_, a, b)| b - a).sum::<u64>();
    std::fs::create_dir_all(&job.output.dir).map_err(|e| WorkerError::io(&job.output.dir, e))?;
    let metrics = MetricsLog::open(&job.output.dir)?;

    let table_rows = resolve_table_rows(job);
    let model = Dlrm::new(job, table_rows.clone())?;
    let batch_size = job.train.batch_size;
    let mut step = TrainStep::new(model, &job.optimizer.dense, batch_size);

    let mut eval_stats = ReadStats::default();
    let mut evals = Evaluations::new(job, &step.model, &slice, metrics, started, &mut eval_stats)?;
    let mut early_stopped = false;
    let budget = match job.train.max_samples {
        0 => train_rows * job.train.epochs as u64,
        max => (train_rows * job.train.epochs as u64).min(max),
    };

    let schedule = job.optimizer.schedule;
    let pb = progress_bar(progress, budget, "training");
    let (mut samples, mut steps) = (0u64, 0u64);
    let mut train_time = 0.0f64;
    let mut last_eval = None;
    let mut next_eval = Some(job.train.eval_every)
        .filter(|&e| e > 0)
        .unwrap_or(u64::MAX);
    let mut read_stats = ReadStats::default();
    let (mut epoch_loss, mut epochs_run) = ((0.0f64, 0u64), 0);
    let mut preprocess = None;
    'epochs: for epoch in 0..job.train.epochs {
        epochs_run = epoch + 1;
        epoch_loss = (0.0, 0);
        let mut reader = Feed::new(Prefetcher::start(train_segments.clone(), job), job, epoch);
        let mut t0 = Instant::now();
        while let Some(batch) = reader.next() {
            let mut batch = batch?;
            if job.train.max_samples > 0 {
                let left = job.train.max_samples - samples;
                if left == 0 {
                    reader.finish(&mut preprocess, &mut read_stats);
                    break 'epochs;
                }
                truncate(&mut batch, left as usize);
            }
            if !schedule.is_constant() {
                step.set_lr_scale(schedule.scale(samples, budget));
            }
            let t_step = Instant::now();
            let loss = step.train_batch(&batch)?;
            reader.reader.record_step(t_step.elapsed().as_secs_f64());
            if !loss.is_finite() {
                return Err(WorkerError::Diverged { step: steps, loss });
            }
            let n = batch.len() as u64;
            reader.recycle(batch);
            samples += n;
            steps += 1;
            epoch_loss.0 += loss as f64 * n as f64;
            epoch_loss.1 += n;
            pb.set_position(samples);
            if steps.is_multiple_of(10) {
                pb.set_message(format!("loss {:.4}", epoch_loss.0 / epoch_loss.1 as f64));
            }
            if samples >= next_eval {
                train_time += t0.elapsed().as_secs_f64();
                let at = Position {
                    epoch,
                    samples,
                    steps,
                    loss: epoch_loss,
                    train_time,
                };
                let (r, stop) = evals.at(&step.model, job, &pb, "eval", &at)?;
                last_eval = Some(r);
                next_eval += job.train.eval_every;
                if stop {
                    early_stopped = true;
                    reader.finish(&mut preprocess, &mut read_stats);
                    break 'epochs;
                }
                t0 = Instant::now();
            }
        }
        train_time += t0.elapsed().as_secs_f64();
        reader.finish(&mut preprocess, &mut read_stats);
        if samples == 0 {
            return Err(all_rows_skipped(job, &read_stats));
        }
        let at = Position {
            epoch,
            samples,
            steps,
            loss: epoch_loss,
            train_time,
        };
        let (r, stop) = evals.at(&step.model, job, &pb, "epoch", &at)?;
        last_eval = Some(r);
        if stop {
            early_stopped = true;
            break;
        }
    }
    pb.finish_and_clear();
    let Concluded {
        eval: last_eval,
        task_evals,
        best,
    } = evals.concluded(&step.model, last_eval)?;
    let model_path = save_final_model(&step.model, job, best.is_some())?;
    read_stats.merge(&eval_stats);
    let summary = Summary {
        samples,
        steps,
        epochs: epochs_run,
        samples_per_s: samples as f64 / train_time.max(1e-9),
        train_loss: epoch_loss.0 / epoch_loss.1.max(1) as f64,
        eval: last_eval,
        task_evals,
        teacher_auc: elastrec_data::gen::read_report(&job.data.dir)
            .ok()
            .map(|r| r.teacher_auc),
        wall_s: started.elapsed().as_secs_f64(),
        threads: rayon::current_num_threads(),
        table_rows,
        embedding_bytes: step.model.embeddings.memory_bytes() as u64,
        dynamic_embeddings: step.model.embeddings.dynamic_summary(),
        rows_skipped: read_stats.rows_skipped,
        lists_truncated: read_stats.lists_truncated,
        list_nulls: read_stats.list_nulls,
        skipped_examples: read_stats.first_errors.clone(),
        model_path,
        preprocess,
        best,
        validation: evals.best_validation,
        early_stopped,
        mix,
    };
    write_summary(job, &summary)?;
    Ok(summary)
}

/// `<output.dir>/summary.json`, written atomically: scripts and dashboards read it as the
/// run's result.
fn write_summary(job: &JobConfig, summary: &Summary) -> Result<()> {
    let path = job.output.dir.join("summary.json");
    let text = serde_json::to_string_pretty(summary).expect("summary serializes");
    elastrec_job::fsio::write_atomic(&path, text.as_bytes())?;
    Ok(())
}

/// The files have rows (checked before training), but `on_bad_row = "skip"` dropped them
/// all.
fn all_rows_skipped(job: &JobConfig, read_stats: &ReadStats) -> WorkerError {
    JobError::NoTrainingData {
        files: job.train_files(),
        reason: format!(
            "all {} rows were skipped as malformed (on_bad_row = \"skip\"), the first as {}",
            read_stats.rows_skipped,
            read_stats.first_errors.first().map_or("?", String::as_str)
        ),
    }
    .into()
}

/// Writes `model.bin` when the job saves its model, unless model selection already wrote
/// the best one there; its path.
fn save_final_model(model: &Dlrm, job: &JobConfig, selected: bool) -> Result<Option<PathBuf>> {
    if !job.output.save_model {
        return Ok(None);
    }
    let p = job.output.dir.join("model.bin");
    if !selected {
        model_file::save(model, job, &p)?;
    }
    Ok(Some(p))
}

/// Keeps the first `n` samples of `batch`.
fn truncate(batch: &mut Batch, n: usize) {
    if batch.len() > n {
        batch.truncate(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use elastrec_data::{BadRowPolicy, RawRow};
    use elastrec_job::config::TableRows;

    /// `rows` rows of Criteo TSV whose label follows the first integer feature.
    fn tsv(rows: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for r in 0..rows {
            let mut row = RawRow {
                label: (r % 2) as u8,
                ..RawRow::default()
            };
            row.ints[0] = Some(10 * (r % 2) as i64);
            row.cats[0] = Some(r as u32 % 7);
            elastrec_data::tsv::write_row(&row, &mut out);
        }
        out
    }

    /// A tiny job over `train` (name, contents) files and one 64-row eval file.
    fn job(dir: &Path, train: &[(&str, Vec<u8>)]) -> JobConfig {
        for (name, bytes) in train {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
        std::fs::write(dir.join("eval.tsv"), tsv(64)).unwrap();
        let mut job = JobConfig::default();
        job.data.dir = dir.to_path_buf();
        job.data.train = train.iter().map(|(n, _)| n.to_string()).collect();
        job.data.eval = vec!["eval.tsv".into()];
        job.model.embedding_dim = 4;
        job.model.bottom_mlp = vec![8, 4];
        job.model.top_mlp = vec![8, 1];
        job.model.table_rows = TableRows::All(64);
        job.train.batch_size = 32;
        job.train.progress = false;
        job.output.dir = dir.join("run");
        job
    }

    /// More files than prefetch buffers: every file's end hands its buffer on, so a job
    /// over many small files (hourly partitions) reads them all instead of stalling.
    #[test]
    fn the_prefetcher_reads_many_more_files_than_it_has_buffers() {
        let dir = tempfile::tempdir().unwrap();
        let files: Vec<(String, Vec<u8>)> = (0..3 * (PREFETCH + 2))
            .map(|i| (format!("f{i}.tsv"), tsv(5)))
            .collect();
        let named: Vec<(&str, Vec<u8>)> =
            files.iter().map(|(n, b)| (n.as_str(), b.clone())).collect();
        let job = job(dir.path(), &named);
        let whole = job.train_files().into_iter().map(Segment::whole).collect();
        let reader = Prefetcher::start(whole, &job);
        let mut rows = 0;
        while let Some(batch) = reader.next() {
            let batch = batch.unwrap();
            rows += batch.len();
            reader.recycle(batch);
        }
        assert_eq!(rows, 5 * files.len());
    }

    /// A `[[preprocess]]` plan computes the same batches wherever it runs, so a job trains
    /// to the same bits with the plan on the reader thread, on the training threads, or
    /// moved between them; and the summary says where it ran.
    #[test]
    fn a_graph_job_trains_the_same_wherever_its_plan_runs() {
        let dir = tempfile::tempdir().unwrap();
        let files: Vec<(String, Vec<u8>)> =
            (0..4).map(|i| (format!("f{i}.tsv"), tsv(400))).collect();
        let named: Vec<(&str, Vec<u8>)> =
            files.iter().map(|(n, b)| (n.as_str(), b.clone())).collect();
        let mut base = job(dir.path(), &named);
        base.preprocess = vec![
            elastrec_preprocess::FeatureSpec {
                name: None,
                input: elastrec_preprocess::Input::One("I1..I13".into()),
                ops: vec!["fill_null(0)".into(), "log1p".into()],
                rows: None,
            },
            elastrec_preprocess::FeatureSpec {
                name: Some("I1_bucket".into()),
                input: elastrec_preprocess::Input::One("I1".into()),
                ops: vec!["fill_null(0)".into(), "bucketize([1, 5, 20])".into()],
                rows: None,
            },
            elastrec_preprocess::FeatureSpec {
                name: None,
                input: elastrec_preprocess::Input::One("C1..C26".into()),
                ops: vec![],
                rows: None,
            },
        ];
        base.model.table_rows = TableRows::All(64);
        let mut results = Vec::new();
        for (i, on) in [
            PreprocessOn::Reader,
            PreprocessOn::Trainer,
            PreprocessOn::Auto,
        ]
        .into_iter()
        .enumerate()
        {
            let mut job = base.clone();
            job.train.preprocess_on = on;
            job.output.dir = dir.path().join(format!("run{i}"));
            let s = train(&job).unwrap();
            let p = s
                .preprocess
                .clone()
                .expect("a graph job reports its placement");
            assert_eq!(p.mode, on);
            match on {
                PreprocessOn::Reader => assert_eq!(p.placement, Placement::ReaderThread),
                PreprocessOn::Trainer => assert_eq!(p.placement, Placement::TrainingThreads),
                PreprocessOn::Auto => {}
            }
            assert!(p.costs.step_s > 0.0 && p.costs.read_s > 0.0, "{p:?}");
            results.push((
                s.train_loss.to_bits(),
                s.eval.unwrap().auc.to_bits(),
                s.samples,
            ));
        }
        assert_eq!(results[0], results[1]);
        assert_eq!(results[0], results[2]);
        assert_eq!(results[0].2, 1600);
    }

    /// Four files of 400 rows, evaluated every 10 batches of 32.
    fn selection_job(dir: &Path) -> JobConfig {
        let files: Vec<(String, Vec<u8>)> =
            (0..4).map(|i| (format!("s{i}.tsv"), tsv(400))).collect();
        let named: Vec<(&str, Vec<u8>)> =
            files.iter().map(|(n, b)| (n.as_str(), b.clone())).collect();
        let mut job = job(dir, &named);
        job.train.eval_every = 320;
        job
    }

    /// A model that cannot improve (learning rates 0) is evaluated three times: the first
    /// is the best, the next two are not better, and training stops there, keeping the
    /// first. The validation slice (the last quarter of the rows) is never trained.
    #[test]
    fn early_stopping_stops_after_its_patience_and_keeps_the_best() {
        let dir = tempfile::tempdir().unwrap();
        let mut job = selection_job(dir.path());
        job.optimizer.dense = elastrec_model::DenseOptimizerConfig::Sgd {
            lr: 0.0,
            weight_decay: 0.0,
        };
        job.optimizer.sparse = elastrec_embedding::SparseOptimizerConfig::Sgd { lr: 0.0 };
        job.train.epochs = 5;
        job.train.validation = 0.25;
        job.train.early_stopping = 2;
        let s = train(&job).unwrap();
        assert!(s.early_stopped);
        assert_eq!(s.samples, 3 * 320, "stopped at the third evaluation");
        let best = s.best.unwrap();
        assert_eq!((best.samples, best.epoch), (320, 0));
        let v = s.validation.unwrap();
        assert_eq!(v.samples, 400, "the last quarter of 1,600 rows");
        let lines = std::fs::read_to_string(job.output.dir.join("metrics.jsonl")).unwrap();
        assert_eq!(lines.matches("\"event\":\"validation\"").count(), 3);
    }

    /// With a validation slice, `model.bin` and the summary's `eval` are the model the
    /// slice selected, not the last one; without selection nothing changes.
    #[test]
    fn the_kept_model_is_the_one_the_validation_slice_selected() {
        let dir = tempfile::tempdir().unwrap();
        let mut job = selection_job(dir.path());
        job.train.epochs = 3;
        job.train.eval_every = 0;
        job.train.validation = 0.25;
        let s = train(&job).unwrap();
        assert!(!s.early_stopped);
        assert_eq!(
            s.samples,
            3 * 1200,
            "three epochs of the three quarters trained"
        );
        let best = s.best.unwrap();
        // This data separates perfectly: every epoch's AUC is 1, so the first epoch's
        // model stays the best while later epochs lower the log loss.
        assert_eq!((best.epoch, best.samples), (0, 1200));
        let (model, _) = model_file::load(&job.output.dir.join("model.bin")).unwrap();
        let mut eval_stats = ReadStats::default();
        let eval_set = load_eval_set(&job.eval_files(), &job, &mut eval_stats).unwrap();
        let mut predictor = Predictor::new(&model, job.train.batch_size);
        let again = evaluate(&model, &eval_set, &mut predictor).unwrap();
        let kept = s.eval.unwrap();
        assert_eq!(
            again.logloss.to_bits(),
            kept.logloss.to_bits(),
            "model.bin is the selected model"
        );
        let last: serde_json::Value = std::fs::read_to_string(job.output.dir.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .rfind(|l| l.contains("\"event\":\"epoch\""))
            .map(|l| serde_json::from_str(l).unwrap())
            .unwrap();
        assert!(
            last["logloss"].as_f64().unwrap() < kept.logloss,
            "the last epoch's model differs from the kept one: {last}"
        );
        // Without selection: no best, and the summary is the last model's.
        let mut plain = selection_job(dir.path());
        plain.output.dir = dir.path().join("plain");
        let s = train(&plain).unwrap();
        assert!(s.best.is_none() && s.validation.is_none() && !s.early_stopped);
        assert_eq!(s.samples, 1600);
    }

    /// A shuffle buffer trains every row once per epoch in another order: the same
    /// samples, a different loss than file order, and the same bits on a second run.
    #[test]
    fn a_shuffle_buffer_trains_every_row_once_in_a_seeded_order() {
        let dir = tempfile::tempdir().unwrap();
        let run = |shuffle: usize, name: &str| {
            let mut job = selection_job(dir.path());
            job.train.eval_every = 0;
            job.train.epochs = 2;
            job.train.shuffle_buffer = shuffle;
            job.output.dir = dir.path().join(name);
            train(&job).unwrap()
        };
        let plain = run(0, "plain");
        let a = run(500, "a");
        let b = run(500, "b");
        assert_eq!((plain.samples, a.samples), (3200, 3200));
        assert_ne!(a.train_loss.to_bits(), plain.train_loss.to_bits());
        assert_eq!(a.train_loss.to_bits(), b.train_loss.to_bits());
        // File order: a file's last batch is short (13 batches of 400 rows); drawn from
        // the buffer, batches are full across file ends (50 of 1,600 rows).
        assert_eq!((plain.steps, a.steps), (2 * 4 * 13, 2 * 50));
    }

    /// Training files with no row are an error naming them, raised before the run
    /// directory is created: no summary with the AUC of an untrained model.
    #[test]
    fn empty_training_files_are_an_error_naming_them() {
        let dir = tempfile::tempdir().unwrap();
        let job = job(dir.path(), &[("a.tsv", vec![]), ("b.tsv", vec![])]);
        let err = train(&job).unwrap_err();
        assert!(
            matches!(err, WorkerError::Job(JobError::NoTrainingData { .. })),
            "{err:?}"
        );
        let msg = err.to_string();
        let (a, b) = (dir.path().join("a.tsv"), dir.path().join("b.tsv"));
        assert_eq!(
            msg,
            format!(
                "no training data in {}, {}: the data.train files hold 0 rows",
                a.display(),
                b.display()
            )
        );
        assert!(!job.output.dir.exists());
        assert_eq!(count_train_rows(&job).unwrap_err().to_string(), msg);

        // One file with rows is enough.
        std::fs::write(&b, tsv(3)).unwrap();
        assert_eq!(count_train_rows(&job).unwrap(), vec![(a, 0), (b, 3)]);
    }

    /// Rows that all get skipped as malformed leave nothing to train on either.
    #[test]
    fn training_files_of_only_skipped_rows_are_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut job = job(dir.path(), &[("bad.tsv", b"2\tx\n\n".to_vec())]);
        job.data.on_bad_row = BadRowPolicy::Skip;
        let msg = train(&job).unwrap_err().to_string();
        let bad = dir.path().join("bad.tsv");
        assert!(
            msg.starts_with(&format!(
                "no training data in {}: all 2 rows were skipped as malformed (on_bad_row = \"skip\"), the first as {}:1: field 0:",
                bad.display(),
                bad.display()
            )),
            "{msg}"
        );
        assert!(!job.output.dir.join("summary.json").exists());
    }

    /// `summary.json` and `model.bin` replace the previous files by rename, never by
    /// writing into them: an existing file hard-linked to the old name keeps its bytes
    /// (an in-place write would change them, and a crash would leave a partial file).
    #[test]
    fn run_files_are_replaced_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let job = job(dir.path(), &[("day.tsv", tsv(200))]);
        std::fs::create_dir_all(&job.output.dir).unwrap();
        let mut previous = Vec::new();
        for name in ["summary.json", "model.bin"] {
            let keep = dir.path().join(format!("previous-{name}"));
            std::fs::write(&keep, b"previous run").unwrap();
            std::fs::hard_link(&keep, job.output.dir.join(name)).unwrap();
            previous.push(keep);
        }
        let summary = train(&job).unwrap();
        assert_eq!(summary.samples, 200);
        for keep in &previous {
            assert_eq!(std::fs::read(keep).unwrap(), b"previous run");
        }
        let written: serde_json::Value =
            serde_json::from_slice(&std::fs::read(job.output.dir.join("summary.json")).unwrap())
                .unwrap();
        assert_eq!(written["samples"], 200);
        model_file::load(&job.output.dir.join("model.bin")).unwrap();
        let leftovers: Vec<_> = std::fs::read_dir(&job.output.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }
}
