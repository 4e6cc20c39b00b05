//! Model selection and early stopping in `elastrec run` (`train.validation`,
//! `train.early_stopping`): the same rules as `elastrec train` (`elastrec_job::selection`),
//! applied to checkpoints.
//!
//! At every evaluation point (each `train.eval_every` samples, and each epoch's end) the
//! master takes a checkpoint and has `elastrec export` convert it and evaluate the model on
//! the validation slice (the last `train.validation` share of the training rows, which the
//! task queue never deals) and on the eval files. Training goes on meanwhile, as beside an
//! evaluator in other trainers: the parameter servers serve the workers, the child process
//! reads the checkpoint. The best model's file is kept; once `train.early_stopping`
//! evaluations in a row bring no better AUC, training stops (the job then ends as a
//! finished one). When the job ends, its final checkpoint is judged too, and
//! `<output.dir>/model.bin` is the best model seen.
//!
//! Points are not queued: a point that falls due while an evaluation runs is taken by
//! the next evaluation, at the samples trained by then. The state (the slice, every
//! evaluation, the best) lives in `<output.dir>/validation/state.json`, written after
//! each evaluation, so a resumed master goes on judging where it stopped.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use elastrec_common::EvalResult;
use elastrec_job::config::JobConfig;
use elastrec_job::selection::{Selection, Verdict};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::checkpoint::Coordinator;
use crate::core::MasterCore;
use crate::events::event;
use crate::export::{ExportCommand, ExportRecord, Judge};

/// The directory of the evaluated models and the state, under `output.dir`.
pub const DIR: &str = "validation";
const STATE_FILE: &str = "state.json";

/// One evaluation of a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    /// The checkpoint evaluated.
    pub checkpoint: u64,
    /// Samples the model had trained on.
    pub samples: u64,
    /// The epoch those samples end in (0-based).
    pub epoch: u32,
    /// The AUC that judged it: task 0's on the validation slice, or on the eval files
    /// when the job has no slice.
    pub auc: f64,
    /// Every task's figures on the validation slice (task 0 first); empty without one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub validation: Vec<EvalResult>,
    /// Every task's figures on the eval files (task 0 first); empty without them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub eval: Vec<EvalResult>,
    /// A new best when it was taken.
    pub better: bool,
}

/// What `result.json` says of model selection (`validation`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ValidationReport {
    /// Rows of the validation slice (0: the eval files judge).
    pub slice_rows: u64,
    /// `train.early_stopping` (0: never stop early).
    pub patience: u32,
    /// Every evaluation, in order.
    pub evaluations: Vec<Evaluation>,
    /// The best one: the model in `model.bin`.
    pub best: Option<Evaluation>,
    /// Training stopped early: `patience` evaluations in a row brought no better AUC.
    /// The rows of the epochs not trained then show as `missing` in the ledger.
    pub early_stopped: bool,
    /// Evaluations that failed (the job trained on; the next point was tried).
    pub failures: u64,
}

/// The state kept in `state.json`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct State {
    /// The validation slice: `(file, start row, end row)` ranges.
    slice: Vec<(PathBuf, u64, u64)>,
    selection: Selection,
    report: ValidationReport,
    /// The best model's export (its file in this directory).
    best_model: Option<ExportRecord>,
    /// Samples at which the next evaluation falls due.
    next_at: u64,
}

/// Judges a job's checkpoints and keeps the best model.
pub struct Validator {
    command: ExportCommand,
    dir: PathBuf,
    /// The slice, the eval files: the same for every evaluation.
    judge: Judge,
    every: u64,
    epoch_rows: u64,
    epochs: u32,
    state: Mutex<State>,
    /// Held by the evaluation that runs: one at a time, and the final one waits for it.
    turn: Arc<tokio::sync::Mutex<()>>,
}

/// True when the job asks for model selection.
pub fn wanted(cfg: &JobConfig) -> bool {
    cfg.train.validation > 0.0 || cfg.train.early_stopping > 0
}

/// Why `elastrec run` cannot select models for this job, when it cannot.
pub fn refusal(cfg: &JobConfig) -> Option<String> {
    if !wanted(cfg) {
        return None;
    }
    let what = "train.validation and train.early_stopping";
    if cfg.stream.is_some() {
        return Some(format!("{what} need a job over files: an online job has no end to select a model at; it judges itself by progressive validation (stream.eval_window)"));
    }
    if cfg.data.follow {
        return Some(format!("{what} need the whole training set at start; a following job's data grows (data.follow)"));
    }
    if !cfg.checkpoint.enabled {
        return Some(format!(
            "{what} judge checkpoints in `elastrec run`; set checkpoint.enabled = true"
        ));
    }
    if cfg.train.validation <= 0.0 && cfg.eval_files().is_empty() {
        return Some("train.early_stopping judges the eval files when the job has no validation slice; name data.eval files or set train.validation".into());
    }
    None
}

/// Writes the first state of a new job: its validation slice, and no evaluation yet
/// under a patience of `cfg`'s `train.early_stopping`.
pub fn create(cfg: &JobConfig, slice: Vec<(PathBuf, u64, u64)>) -> anyhow::Result<()> {
    let dir = cfg.output.dir.join(DIR);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let rows: u64 = slice.iter().map(|(_, a, b)| b - a).sum();
    if rows > 0 {
        event!("validation_slice", rows, "master: {rows} rows at the end of the training files are the validation slice; they are not trained");
    }
    let state = State {
        report: ValidationReport {
            slice_rows: rows,
            patience: cfg.train.early_stopping,
            ..ValidationReport::default()
        },
        selection: Selection::new(cfg.train.early_stopping),
        slice,
        ..State::default()
    };
    save(&dir, &state)
}

fn save(dir: &Path, state: &State) -> anyhow::Result<()> {
    let path = dir.join(STATE_FILE);
    elastrec_job::fsio::write_atomic(&path, &serde_json::to_vec_pretty(state)?)
        .with_context(|| format!("writing {}", path.display()))
}

/// The next evaluation point after `samples`: the next multiple of `every` (when set) or
/// the next epoch's end, whichever comes first.
pub fn next_point(samples: u64, every: u64, epoch_rows: u64) -> u64 {
    let epoch_end = (samples / epoch_rows.max(1) + 1) * epoch_rows.max(1);
    match every {
        0 => epoch_end,
        e => epoch_end.min((samples / e + 1) * e),
    }
}

impl Validator {
    /// The validator of a job whose state [`create`] wrote (a resumed job reads it back).
    pub fn open(
        cfg: &JobConfig,
        command: ExportCommand,
        epoch_rows: u64,
    ) -> anyhow::Result<Arc<Self>> {
        let dir = cfg.output.dir.join(DIR);
        let path = dir.join(STATE_FILE);
        let text = std::fs::read(&path).with_context(|| {
            format!(
                "{}: model selection's state (written when the job started)",
                path.display()
            )
        })?;
        let mut state: State = serde_json::from_slice(&text)
            .with_context(|| format!("{}: not a model selection state", path.display()))?;
        if state.next_at == 0 {
            state.next_at = next_point(0, cfg.train.eval_every, epoch_rows);
        }
        Ok(Arc::new(Self {
            command,
            dir,
            judge: Judge {
                validation: state.slice.clone(),
                eval: cfg.eval_files(),
                on_bad_row: cfg.data.on_bad_row,
            },
            every: cfg.train.eval_every,
            epoch_rows,
            epochs: cfg.train.epochs,
            state: Mutex::new(state),
            turn: Arc::new(tokio::sync::Mutex::new(())),
        }))
    }

    /// Starts an evaluation when the job trains, its samples passed the next point and no
    /// evaluation runs. Called by the control loop.
    pub fn poll(self: &Arc<Self>, core: &Arc<MasterCore>, coordinator: &Arc<Coordinator>) {
        let samples = {
            let job = core.job.lock();
            if *job.phase() != crate::job::Phase::Training {
                return;
            }
            job.samples_done()
        };
        {
            let st = self.state.lock();
            if st.report.early_stopped || samples < st.next_at {
                return;
            }
        }
        let Ok(turn) = self.turn.clone().try_lock_owned() else {
            return;
        };
        let (me, core, c) = (self.clone(), core.clone(), coordinator.clone());
        tokio::spawn(async move {
            let _turn = turn;
            match me.evaluate(&core, &c, "validation").await {
                Ok((_, Verdict::Stop)) => me.stop_early(&core).await,
                Ok(_) => {}
                Err(e) => me.failed(samples, &e),
            }
        });
    }

    /// The job ended: judges its final checkpoint (after any evaluation that runs) and
    /// writes the best model seen to `out` (`output.save_model`). Returns the best model's
    /// export record, its path `out`.
    pub async fn finish(
        &self,
        core: &Arc<MasterCore>,
        coordinator: &Arc<Coordinator>,
        out: Option<&Path>,
    ) -> anyhow::Result<Option<ExportRecord>> {
        let _turn = self.turn.lock().await;
        if let Err(e) = self.evaluate(core, coordinator, "final").await {
            // The best model seen so far still stands.
            self.failed(0, &e);
        }
        let (best, record) = {
            let st = self.state.lock();
            (st.report.best.clone(), st.best_model.clone())
        };
        let (Some(best), Some(record), Some(out)) = (best, record, out) else {
            anyhow::ensure!(out.is_none(), "no evaluation judged a model");
            return Ok(None);
        };
        let file = &record.path;
        // Copied, not moved: the state keeps naming the best file, and a copy interrupted
        // halfway never leaves a partial `model.bin` (written aside, then renamed).
        let tmp = out.with_extension("bin.selecting");
        std::fs::copy(file, &tmp)
            .with_context(|| format!("copying {} to {}", file.display(), tmp.display()))?;
        std::fs::rename(&tmp, out).with_context(|| format!("writing {}", out.display()))?;
        event!("model_selected", checkpoint = best.checkpoint, samples = best.samples, auc = best.auc,
            "master: model.bin is the best model seen: checkpoint {} after {} samples (epoch {}), AUC {:.4}",
            best.checkpoint, best.samples, best.epoch + 1, best.auc);
        Ok(Some(ExportRecord {
            path: out.to_path_buf(),
            ..record
        }))
    }

    /// What `result.json` says.
    pub fn report(&self) -> ValidationReport {
        self.state.lock().report.clone()
    }

    /// One evaluation: a checkpoint (`reason`), its export judged, the verdict recorded
    /// and saved. Run under `turn`.
    async fn evaluate(
        &self,
        core: &Arc<MasterCore>,
        coordinator: &Arc<Coordinator>,
        reason: &'static str,
    ) -> anyhow::Result<(Evaluation, Verdict)> {
        let m = coordinator.spawn_checkpoint(core.clone(), reason).await??;
        let judge = &self.judge;
        let candidate = self.dir.join(format!("model-{}.bin", m.id));
        let rec = self
            .command
            .run_judged(m.id, &candidate, None, Some(judge))
            .await?;
        let judged = if judge.validation.is_empty() {
            &rec.eval
        } else {
            &rec.validation
        };
        let auc = judged.first().map_or(f64::NAN, |r| r.auc);
        let epoch = (rec.samples.saturating_sub(1) / self.epoch_rows.max(1))
            .min(self.epochs.saturating_sub(1) as u64) as u32;
        let mut st = self.state.lock();
        let verdict = st.selection.observe(auc, rec.samples, epoch);
        let e = Evaluation {
            checkpoint: rec.checkpoint,
            samples: rec.samples,
            epoch,
            auc,
            validation: rec.validation.clone(),
            eval: rec.eval.clone(),
            better: verdict == Verdict::Better,
        };
        let dropped = if e.better {
            st.report.best = Some(e.clone());
            st.best_model.replace(rec).map(|r| r.path)
        } else {
            Some(candidate)
        };
        st.report.evaluations.push(e.clone());
        st.next_at = next_point(e.samples, self.every, self.epoch_rows);
        save(&self.dir, &st)?;
        drop(st);
        if let Some(f) = dropped {
            let _ = std::fs::remove_file(f);
        }
        event!(
            "validation",
            checkpoint = e.checkpoint,
            samples = e.samples,
            auc = e.auc,
            better = e.better,
            "master: checkpoint {} after {} samples: AUC {:.4} on the {}{}",
            e.checkpoint,
            e.samples,
            e.auc,
            if judge.validation.is_empty() {
                "eval files"
            } else {
                "validation slice"
            },
            if e.better { " (best so far)" } else { "" }
        );
        Ok((e, verdict))
    }

    /// `patience` evaluations brought nothing better: training ends (the job then ends as
    /// a finished one, its best model kept).
    async fn stop_early(&self, core: &MasterCore) {
        let (best, patience) = {
            let mut st = self.state.lock();
            st.report.early_stopped = true;
            let _ = save(&self.dir, &st);
            (st.report.best.clone(), st.report.patience)
        };
        if let Some(b) = best {
            event!("early_stopped", samples = b.samples, auc = b.auc,
                "master: early stopping: no better AUC in {patience} evaluations; training ends, keeping the model of {} samples (AUC {:.4})",
                b.samples, b.auc);
        }
        if let Err(e) = core.run(|job, cx| job.stop_training(cx)).await {
            event!(warn, "early_stop_failed", error = %e, "master: early stopping could not end training: {e}");
        }
    }

    /// An evaluation failed: the job trains on, the next point is tried.
    fn failed(&self, samples: u64, e: &anyhow::Error) {
        let mut st = self.state.lock();
        st.report.failures += 1;
        st.next_at = next_point(samples, self.every, self.epoch_rows);
        let _ = save(&self.dir, &st);
        event!(warn, "validation_failed", error = %format!("{e:#}"),
            "master: evaluating a checkpoint for model selection failed (training goes on; the next evaluation is at {} samples): {e:#}", st.next_at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_fall_at_every_interval_and_at_each_epoch_end() {
        // 1,000 rows an epoch, every 300 samples: 300, 600, 900, then the epoch's end.
        let mut at = 0;
        let mut points = Vec::new();
        for _ in 0..6 {
            at = next_point(at, 300, 1000);
            points.push(at);
        }
        assert_eq!(points, [300, 600, 900, 1000, 1200, 1500]);
        // Without an interval: epoch ends only; a late evaluation skips the points passed.
        assert_eq!(next_point(0, 0, 1000), 1000);
        assert_eq!(next_point(2500, 0, 1000), 3000);
        assert_eq!(next_point(1000, 0, 1000), 2000);
    }

    fn job(text: &str) -> JobConfig {
        JobConfig::from_toml(text, Path::new("job.toml")).unwrap()
    }

    #[test]
    fn jobs_model_selection_cannot_serve_are_refused_with_what_to_do() {
        let files = "[data]\ntrain = [\"a.tsv\"]\neval = [\"b.tsv\"]\n";
        assert_eq!(refusal(&job(files)), None, "nothing asked");
        assert_eq!(
            refusal(&job(&format!("{files}[train]\nvalidation = 0.1\n"))),
            None
        );
        let why = |text: &str| refusal(&job(text)).expect("refused");
        assert!(why(&format!(
            "{files}[train]\nvalidation = 0.1\n[checkpoint]\nenabled = false\n"
        ))
        .contains("checkpoint.enabled = true"));
        assert!(why(&format!(
            "{files}[train]\nearly_stopping = 2\n[stream]\ntopics = [\"clicks\"]\n"
        ))
        .contains("stream.eval_window"));
        // Without a slice, early stopping judges the eval files: it needs some.
        assert!(
            why("[data]\ntrain = [\"a.tsv\"]\neval = []\n[train]\nearly_stopping = 2\n")
                .contains("data.eval")
        );
    }

    #[test]
    fn a_new_state_carries_the_slice_and_the_patience() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = job(&format!(
            "[train]\nearly_stopping = 1\n[output]\ndir = \"{}\"\n",
            dir.path().display()
        ));
        let slice = vec![
            (PathBuf::from("b.tsv"), 20, 30),
            (PathBuf::from("c.tsv"), 0, 20),
        ];
        create(&cfg, slice.clone()).unwrap();
        let text = std::fs::read(dir.path().join(DIR).join(STATE_FILE)).unwrap();
        let mut st: State = serde_json::from_slice(&text).unwrap();
        assert_eq!(st.slice, slice);
        assert_eq!(st.report.slice_rows, 30);
        assert_eq!(st.report.patience, 1);
        assert_eq!(st.selection.observe(0.7, 100, 0), Verdict::Better);
        assert_eq!(
            st.selection.observe(0.7, 200, 0),
            Verdict::Stop,
            "a patience of 1"
        );
    }
}
