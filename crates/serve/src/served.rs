//! The served model and what happens to it: predictions under a read lock, deltas and new
//! models under the write lock.
//!
//! A delta changes only the rows it carries, in place: it holds the write lock for the
//! time those rows take to copy (milliseconds for an online job's push), and a request
//! waits for it rather than failing, so none is dropped. A request sees either the model
//! before a delta or after it, never a mix. A whole new model is parsed and built before
//! the lock is taken; the swap itself is a pointer move.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use elastrec_data::{Batch, RawColumns, RawRow};
use elastrec_preprocess::Plan;
use elastrec_worker::model_file::{LoadedModel, ModelDelta};
use elastrec_worker::{Dlrm, Predictor};
use parking_lot::{Mutex, RwLock};
use serde::Serialize;

/// Why an update was refused.
#[derive(Debug)]
pub enum UpdateError {
    /// The bytes are not a valid model or delta file.
    Invalid(String),
    /// A valid delta that does not start from the served checkpoint.
    Conflict {
        /// What went wrong.
        reason: String,
        /// The served checkpoint.
        served: Option<u64>,
    },
}

impl std::fmt::Display for UpdateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Invalid(r) | Self::Conflict { reason: r, .. } => f.write_str(r),
        }
    }
}

/// Why a prediction was not made.
#[derive(Debug)]
pub enum PredictError {
    /// The server was started without a model and none was pushed yet.
    NoModel,
    /// The model failed (a bug: the request was checked).
    Failed(String),
}

impl std::fmt::Display for PredictError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoModel => f.write_str(
                "no model is served yet: push one (PUT /v1/model, or a job's output.push) or start the server with a model file",
            ),
            Self::Failed(r) => f.write_str(r),
        }
    }
}

/// One model with the buffers its predictions use.
struct Current {
    model: Dlrm,
    /// The model's `[[preprocess]]` graph; `None`: the default Criteo transform.
    plan: Option<Arc<Plan>>,
    /// The model's named features; `None`: the Criteo features `I1`..`C26`.
    schema: Option<Arc<elastrec_data::Schema>>,
    checkpoint: Option<u64>,
    samples: Option<u64>,
    source: String,
    model_type: String,
    loaded_ms: u64,
    /// Idle prediction buffers; a request takes one and puts it back. Kept with the model
    /// because their sizes follow its shape.
    predictors: Mutex<Vec<Predictor>>,
}

/// Counters shown by `GET /v1/model`.
#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    rows: AtomicU64,
    refused: AtomicU64,
    deltas: AtomicU64,
    delta_rows: AtomicU64,
    models: AtomicU64,
}

/// What is served, as `GET /v1/model` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Info {
    /// Where the model came from (a file, or `push`); `None`: no model yet.
    pub source: Option<String>,
    /// The checkpoint it is at (`None`: a model written by `elastrec train`).
    pub checkpoint: Option<u64>,
    /// Samples it had trained on, when a delta said so.
    pub samples: Option<u64>,
    /// `model.type`.
    pub model_type: Option<String>,
    /// Rows of every embedding table.
    pub table_rows: Vec<u64>,
    /// Dense parameters.
    pub dense_params: usize,
    /// When the served model (or its last delta) was loaded, ms since the Unix epoch.
    pub loaded_ms: Option<u64>,
    /// Prediction requests answered.
    pub requests: u64,
    /// Rows predicted.
    pub rows: u64,
    /// Requests refused as malformed.
    pub refused: u64,
    /// Deltas applied.
    pub deltas: u64,
    /// Embedding rows changed by deltas.
    pub delta_rows: u64,
    /// Whole models loaded after the first.
    pub models: u64,
    /// Largest number of rows in one request.
    pub max_batch: usize,
}

/// The served model.
pub struct Served {
    current: RwLock<Option<Current>>,
    counters: Counters,
    max_batch: usize,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn current(loaded: LoadedModel, source: String) -> Result<Current, String> {
    let plan = elastrec_job::prepare::feature_plan(&loaded.job).map_err(|e| e.to_string())?;
    let model_type = serde_json::to_value(loaded.job.model.model_type)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default();
    Ok(Current {
        model_type,
        schema: elastrec_job::prepare::job_schema(&loaded.job),
        model: loaded.model,
        plan,
        checkpoint: loaded.checkpoint,
        samples: None,
        source,
        loaded_ms: now_ms(),
        predictors: Mutex::new(Vec::new()),
    })
}

impl Served {
    /// Serves `loaded` (read from `source`; `None`: nothing until a model is pushed),
    /// answering requests of up to `max_batch` rows.
    pub fn new(loaded: Option<(LoadedModel, &Path)>, max_batch: usize) -> anyhow::Result<Self> {
        let current = match loaded {
            Some((m, source)) => {
                Some(current(m, source.display().to_string()).map_err(anyhow::Error::msg)?)
            }
            None => None,
        };
        Ok(Self {
            current: RwLock::new(current),
            counters: Counters::default(),
            max_batch: max_batch.max(1),
        })
    }

    /// Largest number of rows in one request.
    pub fn max_batch(&self) -> usize {
        self.max_batch
    }

    /// Counts a request refused as malformed.
    pub fn refused(&self) {
        self.counters.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// Click probabilities of `rows` (at most [`Self::max_batch`]; task 0's of a
    /// multi-task model), and the checkpoint of the model that computed them.
    pub fn predict(&self, rows: &[RawRow]) -> Result<(Vec<f32>, Option<u64>), PredictError> {
        let (probs, tasks, checkpoint) = self.predict_tasks(rows)?;
        if tasks == 1 {
            return Ok((probs, checkpoint));
        }
        Ok((probs.into_iter().step_by(tasks).collect(), checkpoint))
    }

    /// Every task's probabilities of `rows`, row-major (`tasks` per row, task 0 first),
    /// the model's task count, and the checkpoint of the model that computed them.
    pub fn predict_tasks(
        &self,
        rows: &[RawRow],
    ) -> Result<(Vec<f32>, usize, Option<u64>), PredictError> {
        if rows.len() > self.max_batch {
            return Err(PredictError::Failed("too many rows".into()));
        }
        let guard = self.current.read();
        let cur = guard.as_ref().ok_or(PredictError::NoModel)?;
        if cur.schema.is_some() {
            return Err(PredictError::Failed(
                "the model reads named features: send its rows as JSON objects of its \
                 columns (POST /v1/predict)"
                    .into(),
            ));
        }
        let batch = match &cur.plan {
            None => {
                let mut b = elastrec_data::criteo::batch(rows.len());
                for r in rows {
                    b.push_raw(r);
                }
                b
            }
            Some(plan) => {
                let mut cols = RawColumns::with_capacity(rows.len());
                for r in rows {
                    cols.push(r);
                }
                let mut b = Batch::with_widths(rows.len(), plan.dense_width(), plan.sparse_width());
                plan.run(&cols, &mut b, &mut plan.scratch());
                b
            }
        };
        self.predict_with(cur, &batch)
    }

    /// `f` of the model served now and where its inputs come from (its named features,
    /// preprocessing graph or the Criteo preset); `None` when no model is loaded.
    /// Predictions wait while `f` runs.
    pub fn with_model<R>(
        &self,
        f: impl FnOnce(&Dlrm, elastrec_data::FeatureSource<'_>) -> R,
    ) -> Option<R> {
        let guard = self.current.read();
        guard.as_ref().map(|c| {
            let source = elastrec_data::FeatureSource::new(c.schema.as_deref(), c.plan.is_some());
            f(&c.model, source)
        })
    }

    /// The named features of the model served now; `None` for the Criteo features (or no
    /// model).
    pub fn schema(&self) -> Option<Arc<elastrec_data::Schema>> {
        self.current.read().as_ref().and_then(|c| c.schema.clone())
    }

    /// [`Served::predict_tasks`] of a batch of the served model's named features
    /// ([`crate::named::batch_from_json`] of its [`Served::schema`]); a model with other
    /// features (pushed meanwhile) refuses it.
    pub fn predict_named(
        &self,
        batch: &Batch,
        schema: &elastrec_data::Schema,
    ) -> Result<(Vec<f32>, usize, Option<u64>), PredictError> {
        if batch.len() > self.max_batch {
            return Err(PredictError::Failed("too many rows".into()));
        }
        let guard = self.current.read();
        let cur = guard.as_ref().ok_or(PredictError::NoModel)?;
        if cur.schema.as_deref() != Some(schema) {
            return Err(PredictError::Failed(
                "the served model changed its features during the request; send it again".into(),
            ));
        }
        self.predict_with(cur, batch)
    }

    fn predict_with(
        &self,
        cur: &Current,
        batch: &Batch,
    ) -> Result<(Vec<f32>, usize, Option<u64>), PredictError> {
        let rows = batch.len();
        let pooled = cur.predictors.lock().pop();
        let mut predictor = pooled.unwrap_or_else(|| Predictor::new(&cur.model, self.max_batch));
        let tasks = cur.model.dense.tasks();
        let mut probs = Vec::with_capacity(rows * tasks);
        let result = predictor.predict_tasks(&cur.model, batch, &mut probs);
        cur.predictors.lock().push(predictor);
        result.map_err(|e| PredictError::Failed(e.to_string()))?;
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        self.counters.rows.fetch_add(rows as u64, Ordering::Relaxed);
        Ok((probs, tasks, cur.checkpoint))
    }

    /// Applies a delta file's bytes; returns the checkpoint now served and the rows changed.
    pub fn apply_delta(&self, bytes: &[u8]) -> Result<(u64, u64), UpdateError> {
        let delta =
            elastrec_worker::model_file::delta_from_bytes(bytes, Path::new("the pushed delta"))
                .map_err(|e| UpdateError::Invalid(e.to_string()))?;
        self.apply(&delta)
    }

    /// Applies `delta` to the served model when it starts from the served checkpoint.
    pub fn apply(&self, delta: &ModelDelta) -> Result<(u64, u64), UpdateError> {
        let h = &delta.header;
        let mut guard = self.current.write();
        let served = guard.as_ref().and_then(|c| c.checkpoint);
        let Some(cur) = guard.as_mut().filter(|c| c.checkpoint == Some(h.from)) else {
            return Err(UpdateError::Conflict {
                reason: format!(
                    "the delta goes from checkpoint {} to {}, but the served model is at {}; push the full model of checkpoint {}",
                    h.from,
                    h.to,
                    match (&*guard, served) {
                        (None, _) => "no model is served yet".to_string(),
                        (Some(_), None) => "a model from `elastrec train`, of no checkpoint".to_string(),
                        (Some(_), Some(c)) => format!("checkpoint {c}"),
                    },
                    h.to
                ),
                served,
            });
        };
        delta.apply(&mut cur.model).map_err(|e| {
            UpdateError::Invalid(format!("the delta does not fit the served model: {e}"))
        })?;
        cur.checkpoint = Some(h.to);
        cur.samples = Some(h.samples);
        cur.loaded_ms = now_ms();
        let rows = delta.rows();
        self.counters.deltas.fetch_add(1, Ordering::Relaxed);
        self.counters.delta_rows.fetch_add(rows, Ordering::Relaxed);
        Ok((h.to, rows))
    }

    /// Replaces the served model by a model file's bytes; returns its checkpoint.
    pub fn replace(&self, bytes: &[u8]) -> Result<Option<u64>, UpdateError> {
        let loaded =
            elastrec_worker::model_file::model_from_bytes(bytes, Path::new("the pushed model"))
                .map_err(|e| UpdateError::Invalid(e.to_string()))?;
        let next = current(loaded, "push".into()).map_err(UpdateError::Invalid)?;
        let checkpoint = next.checkpoint;
        // Built outside the lock; the old model is dropped after it is released.
        let old = self.current.write().replace(next);
        drop(old);
        self.counters.models.fetch_add(1, Ordering::Relaxed);
        Ok(checkpoint)
    }

    /// What is served now.
    pub fn info(&self) -> Info {
        let guard = self.current.read();
        let cur = guard.as_ref();
        let c = &self.counters;
        Info {
            source: cur.map(|c| c.source.clone()),
            checkpoint: cur.and_then(|c| c.checkpoint),
            samples: cur.and_then(|c| c.samples),
            model_type: cur.map(|c| c.model_type.clone()),
            table_rows: cur.map_or_else(Vec::new, |c| c.model.embeddings.config().rows.clone()),
            dense_params: cur.map_or(0, |c| c.model.dense.num_params()),
            loaded_ms: cur.map(|c| c.loaded_ms),
            requests: c.requests.load(Ordering::Relaxed),
            rows: c.rows.load(Ordering::Relaxed),
            refused: c.refused.load(Ordering::Relaxed),
            deltas: c.deltas.load(Ordering::Relaxed),
            delta_rows: c.delta_rows.load(Ordering::Relaxed),
            models: c.models.load(Ordering::Relaxed),
            max_batch: self.max_batch,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use elastrec_data::criteo;
    use elastrec_job::config::JobConfig;
    use elastrec_worker::model_file::{self, ModelDelta};

    const ROWS: u64 = 64;

    fn model(seed: u64) -> (Dlrm, JobConfig) {
        let mut job = JobConfig::default();
        job.model.seed = seed;
        let m = Dlrm::new(&job, vec![ROWS; criteo::CATEGORICAL]).unwrap();
        (m, job)
    }

    /// `model` saved as the export of `checkpoint`, and its bytes.
    fn exported(m: &Dlrm, job: &JobConfig, checkpoint: u64, dir: &Path) -> Vec<u8> {
        let path = dir.join(format!("model-{checkpoint}.bin"));
        model_file::save_exported(m, job, Some(checkpoint), &path).unwrap();
        std::fs::read(path).unwrap()
    }

    fn rows() -> Vec<RawRow> {
        (0..5)
            .map(|i| {
                let mut r = RawRow::default();
                for (k, v) in r.ints.iter_mut().enumerate().take(criteo::DENSE) {
                    *v = (k % 3 != 0).then_some((i * 7 + k) as i64);
                }
                for (k, c) in r.cats.iter_mut().enumerate() {
                    *c = Some((i * 31 + k * 5) as u32);
                }
                r
            })
            .collect()
    }

    /// What `m` predicts for `rows`, computed as `elastrec eval` does.
    fn expected(m: &Dlrm, rows: &[RawRow]) -> Vec<f32> {
        let mut b = elastrec_data::criteo::batch(rows.len());
        rows.iter().for_each(|r| b.push_raw(r));
        let mut p = Vec::new();
        Predictor::new(m, rows.len())
            .predict(m, &b, &mut p)
            .unwrap();
        p
    }

    fn served_from(bytes: &[u8]) -> Served {
        let loaded = model_file::model_from_bytes(bytes, Path::new("m")).unwrap();
        Served::new(Some((loaded, Path::new("m"))), 16).unwrap()
    }

    /// A multi-task model serves every task: `predict_tasks` gives each row's
    /// probabilities task after task, as the trainer's predictor computes them, and
    /// `predict` task 0's.
    #[test]
    fn a_multi_task_model_serves_every_task() {
        let dir = tempfile::tempdir().unwrap();
        let mut job = JobConfig::default();
        job.model.model_type = elastrec_job::config::ModelType::Mmoe;
        let m = Dlrm::new(&job, vec![ROWS; criteo::CATEGORICAL]).unwrap();
        assert_eq!(m.dense.tasks(), 2);
        let served = served_from(&exported(&m, &job, 3, dir.path()));
        let rows = rows();
        let (probs, tasks, checkpoint) = served.predict_tasks(&rows).unwrap();
        assert_eq!((tasks, checkpoint), (2, Some(3)));
        let mut b = elastrec_data::criteo::batch(rows.len());
        rows.iter().for_each(|r| b.push_raw(r));
        let mut want = Vec::new();
        Predictor::new(&m, rows.len())
            .predict_tasks(&m, &b, &mut want)
            .unwrap();
        assert_eq!(probs, want);
        let first: Vec<f32> = want.iter().copied().step_by(2).collect();
        assert_eq!(served.predict(&rows).unwrap().0, first);
        assert_eq!(first, expected(&m, &rows));
        // The tasks have towers of their own.
        assert!(want.chunks(2).any(|p| p[0] != p[1]));
    }

    /// With dynamic tables a model holds the keys it stored, and a delta carries rows by
    /// key: a key the served model lacks is added, a stored one changed.
    #[test]
    fn a_delta_of_a_dynamic_model_adds_and_changes_rows_by_key() {
        let dir = tempfile::tempdir().unwrap();
        let mut job = JobConfig::default();
        job.model.dynamic_embeddings = Some(Default::default());
        let table_rows = vec![ROWS; criteo::CATEGORICAL];
        let rows = rows();
        let mut batch = elastrec_data::criteo::batch(rows.len());
        rows.iter().for_each(|r| batch.push_raw(r));
        // The keys of table 0 for the first two request rows.
        let probe = Dlrm::new(&job, table_rows.clone()).unwrap();
        let mut keys = vec![0; batch.sparse.len()];
        probe
            .embeddings
            .ids_to_rows(&batch.sparse, &mut keys)
            .unwrap();
        let (first, second) = (keys[0], keys[criteo::CATEGORICAL]);
        // Stores `keys` in table 0 of `m`, each at its current value plus `by`.
        let moved = |m: &mut Dlrm, keys: &[u64], by: f32| {
            let table = m.embeddings.table(0).unwrap();
            let (dim, stride) = (table.dim(), table.stride());
            let mut snap = table.export_rows(&[]).unwrap();
            for &k in keys {
                let mut row = vec![0.0; stride];
                table.read_weights(k, &mut row[..dim]).unwrap();
                row[..dim].iter_mut().for_each(|w| *w += by);
                snap.rows.push(k);
                snap.values.extend_from_slice(&row);
            }
            m.embeddings.import_table(&snap).unwrap();
        };
        let mut old = Dlrm::new(&job, table_rows.clone()).unwrap();
        moved(&mut old, &[first], 0.5);
        let old_bytes = exported(&old, &job, 3, dir.path());
        let served = served_from(&old_bytes);
        assert_eq!(served.predict(&rows).unwrap().0, expected(&old, &rows));

        // Checkpoint 5: the stored key moved again, and a second key was admitted.
        let mut new = Dlrm::new(&job, table_rows).unwrap();
        moved(&mut new, &[first], 0.5);
        moved(&mut new, &[first, second], 0.25);
        let prev = model_file::model_from_bytes(&old_bytes, Path::new("m")).unwrap();
        let delta = ModelDelta::between(&prev, &new, 5, 1000).unwrap();
        assert_eq!(delta.rows(), 2);
        let path = dir.path().join("delta-3-5.bin");
        model_file::save_delta(&delta, &path).unwrap();
        assert_eq!(
            served.apply_delta(&std::fs::read(&path).unwrap()).unwrap(),
            (5, 2)
        );
        let after = served.predict(&rows).unwrap().0;
        assert_eq!(after, expected(&new, &rows));
        assert_ne!(after, expected(&old, &rows));

        // Checkpoint 7: the job evicted the first key. The delta says so, and the served
        // model drops it (it reads as its initial value again, as in the job).
        let mut newer = Dlrm::new(&job, vec![ROWS; criteo::CATEGORICAL]).unwrap();
        moved(&mut newer, &[second], 0.25);
        let new_bytes = exported(&new, &job, 5, dir.path());
        let prev = model_file::model_from_bytes(&new_bytes, Path::new("m")).unwrap();
        let delta = ModelDelta::between(&prev, &newer, 7, 2000).unwrap();
        assert_eq!(delta.rows(), 0, "the second key did not change");
        assert_eq!(delta.header.evicted.len(), 1);
        assert_eq!(
            (delta.header.evicted[0].table, &delta.header.evicted[0].keys),
            (0, &vec![first])
        );
        let path = dir.path().join("delta-5-7.bin");
        model_file::save_delta(&delta, &path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        served.apply_delta(&bytes).unwrap();
        assert_eq!(served.predict(&rows).unwrap().0, expected(&newer, &rows));
        // Evicted keys of a table index the model does not have: refused as read.
        let mut bad = delta;
        bad.header.evicted[0].table = criteo::CATEGORICAL;
        bad.header.from = 7;
        bad.header.to = 9;
        let path = dir.path().join("delta-7-9.bin");
        model_file::save_delta(&bad, &path).unwrap();
        let e = served
            .apply_delta(&std::fs::read(&path).unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("evicted keys of table 26 of 26 tables"), "{e}");
        assert_eq!(served.predict(&rows).unwrap().0, expected(&newer, &rows));
    }

    #[test]
    fn a_delta_changes_exactly_the_changed_rows_and_wrong_ones_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (old, job) = model(1);
        let old_bytes = exported(&old, &job, 3, dir.path());
        let served = served_from(&old_bytes);
        let rows = rows();
        assert_eq!(
            served.predict(&rows).unwrap(),
            (expected(&old, &rows), Some(3))
        );

        // Checkpoint 5: three rows of table 0 moved, and every dense parameter.
        let (mut new, _) = model(1);
        let mut snap = new
            .embeddings
            .table(0)
            .unwrap()
            .export_rows(&[0, 5, 31])
            .unwrap();
        snap.values.iter_mut().for_each(|v| *v += 0.5);
        new.embeddings.import_table(&snap).unwrap();
        new.dense.params_mut().iter_mut().for_each(|p| *p *= 0.9);
        let prev = model_file::model_from_bytes(&old_bytes, Path::new("m")).unwrap();
        let delta = ModelDelta::between(&prev, &new, 5, 1000).unwrap();
        assert_eq!(delta.rows(), 3);
        let path = dir.path().join("delta-3-5.bin");
        model_file::save_delta(&delta, &path).unwrap();
        let delta_bytes = std::fs::read(&path).unwrap();

        // A cut or foreign file is refused and the served model is unchanged.
        let cut = &delta_bytes[..delta_bytes.len() - 9];
        assert!(
            matches!(served.apply_delta(cut), Err(UpdateError::Invalid(r)) if r.contains("checksum"))
        );
        assert!(
            matches!(served.apply_delta(&old_bytes), Err(UpdateError::Invalid(r)) if r.contains("a model file where a model delta file was expected"))
        );
        assert!(matches!(
            served.replace(&delta_bytes),
            Err(UpdateError::Invalid(_))
        ));
        assert_eq!(served.predict(&rows).unwrap().0, expected(&old, &rows));

        assert_eq!(served.apply_delta(&delta_bytes).unwrap(), (5, 3));
        let after = served.predict(&rows).unwrap();
        assert_eq!(after, (expected(&new, &rows), Some(5)));
        assert_ne!(after.0, expected(&old, &rows));
        let info = served.info();
        assert_eq!(
            (info.checkpoint, info.samples, info.deltas, info.delta_rows),
            (Some(5), Some(1000), 1, 3)
        );

        // The same delta again no longer starts from the served checkpoint.
        match served.apply_delta(&delta_bytes) {
            Err(UpdateError::Conflict { served, reason }) => {
                assert_eq!(served, Some(5));
                assert!(
                    reason.contains(
                        "goes from checkpoint 3 to 5, but the served model is at checkpoint 5"
                    ),
                    "{reason}"
                );
            }
            other => panic!("{other:?}"),
        }
        // A whole model replaces it.
        assert_eq!(served.replace(&old_bytes).unwrap(), Some(3));
        assert_eq!(
            served.predict(&rows).unwrap(),
            (expected(&old, &rows), Some(3))
        );
    }

    #[test]
    fn deltas_need_a_base_of_the_same_shape_from_a_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let (m, job) = model(1);
        let bytes = exported(&m, &job, 3, dir.path());
        let prev = model_file::model_from_bytes(&bytes, Path::new("m")).unwrap();
        assert!(ModelDelta::between(&prev, &m, 3, 0)
            .unwrap_err()
            .contains("not older than 3"));
        let other = Dlrm::new(&job, vec![ROWS + 1; criteo::CATEGORICAL]).unwrap();
        assert_eq!(
            ModelDelta::between(&prev, &other, 4, 0).unwrap_err(),
            "its model has another shape"
        );
        let trained = model_file::LoadedModel {
            checkpoint: None,
            ..prev
        };
        assert!(ModelDelta::between(&trained, &m, 4, 0)
            .unwrap_err()
            .contains("not exported from a checkpoint"));
    }

    #[test]
    fn a_server_without_a_model_waits_for_a_push() {
        let dir = tempfile::tempdir().unwrap();
        let served = Served::new(None, 16).unwrap();
        assert!(matches!(
            served.predict(&rows()),
            Err(PredictError::NoModel)
        ));
        assert!(served.info().source.is_none());
        let (m, job) = model(2);
        assert_eq!(
            served.replace(&exported(&m, &job, 7, dir.path())).unwrap(),
            Some(7)
        );
        assert_eq!(served.predict(&rows()).unwrap().0, expected(&m, &rows()));
        assert_eq!(served.info().source.as_deref(), Some("push"));
    }
}
