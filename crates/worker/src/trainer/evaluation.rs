//! `train`'s evaluations: the held-out set in memory, exact AUC and log loss over it,
//! model selection on the validation slice, and the metrics log.

use super::*;

/// Reads every held-out file into memory as batches of `batch_size`.
pub fn load_eval_set(
    files: &[PathBuf],
    job: &JobConfig,
    stats: &mut ReadStats,
) -> Result<Vec<Batch>> {
    let mut batches = Vec::new();
    let plan = elastrec_job::prepare::feature_plan(job)?;
    let schema = elastrec_job::prepare::job_schema(job);
    for f in files {
        let reader = elastrec_data::open_source(f, None, job.data.on_bad_row, schema.as_ref())?;
        let mut reader = elastrec_job::prepare::preprocessed(reader, plan.as_ref());
        read_batches(reader.as_mut(), job, f, &mut batches)?;
        stats.merge(reader.stats());
    }
    Ok(batches)
}

/// Every batch of the job's batch size `reader` (of `path`) has left, appended to `out`;
/// rows must carry one label per task of the job's model.
pub(super) fn read_batches(
    reader: &mut dyn BatchReader,
    job: &JobConfig,
    path: &Path,
    out: &mut Vec<Batch>,
) -> Result<()> {
    let (rows, tasks) = (job.train.batch_size, job.model.tasks());
    loop {
        let mut b = Batch::default();
        if reader.next_batch(&mut b, rows)? == 0 {
            return Ok(());
        }
        b.check_tasks(tasks, path)?;
        out.push(b);
    }
}

/// Exact AUC and log loss of `model` over `batches` (task 0's of a multi-task model).
pub fn evaluate(model: &Dlrm, batches: &[Batch], predictor: &mut Predictor) -> Result<EvalResult> {
    Ok(evaluate_tasks(model, batches, predictor, None)?[0])
}

/// Every figure ([`EvalResult`]) of every task of `model` over `batches`, task 0 first;
/// with GAUC over the single-id column `user` (`JobConfig`'s `data.user_slot()`) when
/// given.
pub fn evaluate_tasks(
    model: &Dlrm,
    batches: &[Batch],
    predictor: &mut Predictor,
    user: Option<usize>,
) -> Result<Vec<EvalResult>> {
    evaluate_tasks_each(model, batches, predictor, user, |_, _| Ok(()))
}

/// [`evaluate_tasks`], handing each batch and its predictions (`[n, tasks]`, row-major)
/// to `each` on the way (`elastrec eval --predictions` writes them out).
pub fn evaluate_tasks_each(
    model: &Dlrm,
    batches: &[Batch],
    predictor: &mut Predictor,
    user: Option<usize>,
    mut each: impl FnMut(&Batch, &[f32]) -> Result<()>,
) -> Result<Vec<EvalResult>> {
    let tasks = model.dense.tasks();
    let mut accs: Vec<EvalAccumulator> = (0..tasks).map(|_| EvalAccumulator::new()).collect();
    let mut probs = Vec::new();
    for b in batches {
        if b.tasks != tasks {
            return Err(WorkerError::Model(elastrec_model::ModelError::Shape {
                what: "labels per evaluation row (model.mmoe.tasks)",
                expected: tasks,
                got: b.tasks,
            }));
        }
        predictor.predict_tasks(model, b, &mut probs)?;
        crate::step::push_task_figures(&mut accs, &probs, b, user);
        each(b, &probs)?;
    }
    Ok(accs.iter().map(EvalAccumulator::result).collect())
}

/// The run's evaluations: the eval files, the metrics log and, with `train.validation`
/// or `train.early_stopping`, model selection and early stopping ([`crate::selection`]).
pub(super) struct Evaluations {
    pub(super) eval_set: Vec<Batch>,
    pub(super) predictor: Predictor,
    /// The user column for GAUC (`data.user`).
    pub(super) user: Option<usize>,
    pub(super) metrics: MetricsLog,
    pub(super) started: Instant,
    pub(super) active: bool,
    pub(super) selection: Selection,
    /// The validation slice, in memory; empty without one.
    pub(super) validation: Vec<Batch>,
    /// Where the best model is written when it is seen.
    pub(super) save: Option<PathBuf>,
    pub(super) best_validation: Option<EvalResult>,
    /// Every task's figures (task 0 first) of the last evaluation on the eval files, and
    /// of the best model's (empty until model selection found one).
    pub(super) last_tasks: Vec<EvalResult>,
    pub(super) best_tasks: Vec<EvalResult>,
}

/// The figures of a finished training run ([`Evaluations::concluded`]).
pub(super) struct Concluded {
    pub(super) eval: Option<EvalResult>,
    /// Every task's, when the model has several.
    pub(super) task_evals: Option<Vec<EvalResult>>,
    /// Model selection's pick.
    pub(super) best: Option<Best>,
}

impl Evaluations {
    /// The job's evaluation files and validation `slice` loaded (their read statistics
    /// into `stats`), nothing judged yet.
    pub(super) fn new(
        job: &JobConfig,
        model: &Dlrm,
        slice: &[(PathBuf, u64, u64)],
        metrics: MetricsLog,
        started: Instant,
        stats: &mut ReadStats,
    ) -> Result<Self> {
        Ok(Self {
            eval_set: load_eval_set(&job.eval_files(), job, stats)?,
            predictor: Predictor::new(model, job.train.batch_size),
            user: job.data.user_slot(),
            metrics,
            started,
            active: job.train.validation > 0.0 || job.train.early_stopping > 0,
            selection: Selection::new(job.train.early_stopping),
            validation: load_slice(slice, job, stats)?,
            save: job
                .output
                .save_model
                .then(|| job.output.dir.join("model.bin")),
            best_validation: None,
            last_tasks: Vec::new(),
            best_tasks: Vec::new(),
        })
    }

    /// What the summary reports once training ended: the last evaluation (one made now
    /// when none was), every task's figures when the model has several, and with model
    /// selection the kept (best) model's figures and the pick.
    pub(super) fn concluded(
        &mut self,
        model: &Dlrm,
        mut last: Option<EvalResult>,
    ) -> Result<Concluded> {
        if last.is_none_or(|e| e.samples == 0) && !self.eval_set.is_empty() {
            self.last_tasks =
                evaluate_tasks(model, &self.eval_set, &mut self.predictor, self.user)?;
            last = Some(self.last_tasks[0]);
        }
        let best = self.active.then(|| self.selection.best()).flatten();
        if best.is_some() {
            if let Some(&b) = self.best_tasks.first() {
                last = Some(b);
                self.last_tasks = std::mem::take(&mut self.best_tasks);
            }
        }
        let task_evals = (model.dense.tasks() > 1 && !self.last_tasks.is_empty())
            .then(|| self.last_tasks.clone());
        Ok(Concluded {
            eval: last,
            task_evals,
            best,
        })
    }

    /// Evaluates `model` on the eval files at `at` (logged as `event`) and judges it;
    /// true: stop training.
    pub(super) fn at(
        &mut self,
        model: &Dlrm,
        job: &JobConfig,
        pb: &ProgressBar,
        event: &str,
        at: &Position,
    ) -> Result<(EvalResult, bool)> {
        let tasks = evaluate_tasks(model, &self.eval_set, &mut self.predictor, self.user)?;
        report_eval(pb, &mut self.metrics, event, at, &tasks, self.started)?;
        let r = tasks[0];
        self.last_tasks = tasks;
        let stop = self.judge(model, job, &r, at, pb)?;
        Ok((r, stop))
    }

    /// Judges the model just evaluated (`eval` on the eval files); true: stop training.
    pub(super) fn judge(
        &mut self,
        model: &Dlrm,
        job: &JobConfig,
        eval: &EvalResult,
        at: &Position,
        pb: &ProgressBar,
    ) -> Result<bool> {
        if !self.active {
            return Ok(false);
        }
        let validation = if self.validation.is_empty() {
            None
        } else {
            let v = evaluate_tasks(model, &self.validation, &mut self.predictor, self.user)?;
            report_eval(pb, &mut self.metrics, "validation", at, &v, self.started)?;
            Some(v[0])
        };
        let auc = validation.map_or(eval.auc, |v| v.auc);
        match self.selection.observe(auc, at.samples, at.epoch) {
            Verdict::Better => {
                self.best_validation = validation;
                self.best_tasks = self.last_tasks.clone();
                if let Some(p) = &self.save {
                    model_file::save(model, job, p)?;
                }
                Ok(false)
            }
            Verdict::NotBetter => Ok(false),
            Verdict::Stop => {
                let b = self.selection.best().expect("a best before a stop");
                say(
                    pb,
                    format!(
                        "early stopping: no better {} AUC in {} evaluations; keeping the model of {} samples (AUC {:.4})",
                        if validation.is_some() { "validation" } else { "eval" },
                        job.train.early_stopping,
                        b.samples,
                        b.auc
                    ),
                );
                Ok(true)
            }
        }
    }
}

/// The validation slice's rows (`(file, start, end)` ranges) through the job's graph.
pub fn load_slice(
    slice: &[(PathBuf, u64, u64)],
    job: &JobConfig,
    stats: &mut ReadStats,
) -> Result<Vec<Batch>> {
    let plan = elastrec_job::prepare::feature_plan(job)?;
    let schema = elastrec_job::prepare::job_schema(job);
    let mut batches = Vec::new();
    for (f, start, end) in slice {
        let mut reader = elastrec_job::prepare::open_job_reader(
            plan.as_ref(),
            schema.as_ref(),
            f,
            *start,
            *end,
            job.data.on_bad_row,
        )?;
        read_batches(reader.as_mut(), job, f, &mut batches)?;
        stats.merge(reader.stats());
    }
    Ok(batches)
}

/// Prints a line above the progress bar, or plainly when the bar is hidden.
pub(super) fn say(pb: &ProgressBar, line: String) {
    if pb.is_hidden() {
        eprintln!("{line}");
    } else {
        pb.println(line);
    }
}

/// Appends one JSON object per line to `metrics.jsonl`, and the same figures as scalars
/// to a TensorBoard event file in the run directory.
pub(super) struct MetricsLog {
    pub(super) file: std::fs::File,
    pub(super) path: PathBuf,
    pub(super) board: EventWriter,
}

impl MetricsLog {
    pub(super) fn open(dir: &Path) -> Result<Self> {
        let path = dir.join("metrics.jsonl");
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| WorkerError::io(&path, e))?;
        let board = EventWriter::create(dir).map_err(|e| WorkerError::io(dir, e))?;
        Ok(Self { file, path, board })
    }

    pub(super) fn write(&mut self, value: serde_json::Value) -> Result<()> {
        writeln!(self.file, "{value}").map_err(|e| WorkerError::io(&self.path, e))
    }

    /// Scalars at `samples` trained (TensorBoard's step).
    pub(super) fn scalars(&mut self, samples: u64, values: &[(&str, f64)]) -> Result<()> {
        self.board
            .scalars(samples, values)
            .map_err(|e| WorkerError::io(self.board.path(), e))
    }
}

/// Prints an evaluation and appends it to `metrics.jsonl`.
pub(super) fn report_eval(
    pb: &ProgressBar,
    metrics: &mut MetricsLog,
    event: &str,
    at: &Position,
    tasks: &[EvalResult],
    started: Instant,
) -> Result<()> {
    let r = tasks[0];
    let mut line = format!(
        "epoch {} {event} at {} samples: AUC {:.4} logloss {:.4}",
        at.epoch, at.samples, r.auc, r.logloss
    );
    for (t, e) in tasks.iter().enumerate().skip(1) {
        line += &format!("; task {t}: AUC {:.4} logloss {:.4}", e.auc, e.logloss);
    }
    say(pb, line);
    let train_loss = at.loss.0 / at.loss.1.max(1) as f64;
    let samples_per_s = at.samples as f64 / at.train_time.max(1e-9);
    let mut record = serde_json::json!({
        "event": event, "epoch": at.epoch, "samples": at.samples, "steps": at.steps,
        "train_loss": train_loss,
        "auc": r.auc, "logloss": r.logloss, "ne": r.ne, "calibration": r.calibration,
        "samples_per_s": samples_per_s,
        "elapsed_s": started.elapsed().as_secs_f64(),
    });
    if let Some(g) = r.gauc {
        record["gauc"] = g.into();
    }
    if tasks.len() > 1 {
        record["tasks"] = serde_json::to_value(tasks).expect("figures serialize");
    }
    metrics.write(record)?;
    // TensorBoard: the validation slice's figures apart from the eval files'.
    let set = if event == "validation" {
        "validation"
    } else {
        "eval"
    };
    let mut scalars: Vec<(String, f64)> = Vec::new();
    for (t, e) in tasks.iter().enumerate() {
        let prefix = match t {
            0 => set.to_string(),
            t => format!("{set}/task_{t}"),
        };
        scalars.extend(e.scalars(&prefix));
    }
    if set == "eval" {
        scalars.push(("train/loss".into(), train_loss));
        scalars.push(("train/samples_per_s".into(), samples_per_s));
    }
    let values: Vec<(&str, f64)> = scalars.iter().map(|(t, v)| (t.as_str(), *v)).collect();
    metrics.scalars(at.samples, &values)
}
