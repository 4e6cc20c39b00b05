//! The native half of the `elastrec` Python package (`python/`, built by maturin):
//!
//! * [`Model`]: a model file opened in the process: its tables and dense weights as
//!   numpy arrays, its inputs, and predictions of rows given as dicts (the rows
//!   `elastrec serve` takes, through the model's own preprocessing);
//! * [`Batches`]: a job's files read through elastrec's readers and preprocessing, as
//!   batches of numpy arrays; an iterator a PyTorch `IterableDataset` wraps.
//!
//! Job control (`run`, `status`, `scale`, `stop`) and results as pandas frames are pure
//! Python (`python/elastrec/jobs.py`) over the `elastrec` binary.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

use elastrec_data::{Batch, ReadStats};
use elastrec_export::{params, tables, Signature};
use elastrec_job::config::JobConfig;
use elastrec_serve::served::Served;
use numpy::{PyArray1, PyArrayMethods};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Rows one `predict` call takes.
const MAX_ROWS: usize = 1 << 20;

/// A model file opened for inspection and prediction.
#[pyclass(module = "elastrec", frozen)]
struct Model {
    served: Served,
    path: PathBuf,
}

fn runtime(e: impl std::fmt::Display) -> PyErr {
    PyRuntimeError::new_err(e.to_string())
}

/// `values` as a numpy array of `shape`.
fn array<'py, T: numpy::Element>(
    py: Python<'py>,
    values: Vec<T>,
    shape: &[usize],
) -> PyResult<Bound<'py, PyAny>> {
    let flat = PyArray1::from_vec(py, values);
    Ok(flat.reshape(shape.to_vec())?.into_any())
}

#[pymethods]
impl Model {
    /// Opens `path`, a `model.bin` of `train`, `run` or `export`.
    #[new]
    fn new(path: PathBuf) -> PyResult<Self> {
        let loaded = elastrec_worker::model_file::load_model(&path).map_err(runtime)?;
        let served = Served::new(Some((loaded, &path)), MAX_ROWS).map_err(runtime)?;
        Ok(Self { served, path })
    }

    /// Tasks (labels) the model predicts.
    #[getter]
    fn tasks(&self) -> usize {
        self.served
            .with_model(|m, _| m.dense.tasks())
            .unwrap_or_default()
    }

    /// What the model reads: dense columns, single-id features, lists and tables (as
    /// `elastrec export --format onnx` describes its inputs).
    #[getter]
    fn signature<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let sig = self
            .served
            .with_model(Signature::of)
            .ok_or_else(|| runtime("no model"))?
            .map_err(runtime)?;
        let text = serde_json::to_string(&sig).map_err(runtime)?;
        py.import("json")?.call_method1("loads", (text,))
    }

    /// The model's settings (`[model]` as the file records it), as a dict.
    #[getter]
    fn config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let text = self
            .served
            .with_model(|m, _| serde_json::to_string(m.dense.config()))
            .ok_or_else(|| runtime("no model"))?
            .map_err(runtime)?;
        py.import("json")?.call_method1("loads", (text,))
    }

    /// Every embedding table, `{name: float32 array [rows, width]}` (width: the
    /// embedding dimension, plus the first-order weight when the model has one). Copies:
    /// a stored row keeps its optimizer state beside it, so no table is one array. A
    /// dynamic table gives the rows it stores, then one of zeros ([`Model::keys`] gives
    /// the stored rows' keys).
    fn tables<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let arrays = self
            .served
            .with_model(
                |m, source| -> Result<Vec<(String, Vec<f32>, usize)>, String> {
                    let sig = Signature::of(m, source).map_err(|e| e.to_string())?;
                    let width = m.embeddings.dim();
                    sig.tables
                        .iter()
                        .enumerate()
                        .map(|(t, info)| {
                            let rows = tables::table_rows(m, t).map_err(|e| e.to_string())?;
                            Ok((info.name.clone(), rows, width))
                        })
                        .collect()
                },
            )
            .ok_or_else(|| runtime("no model"))?
            .map_err(runtime)?;
        let out = PyDict::new(py);
        for (name, values, width) in arrays {
            let rows = values.len() / width.max(1);
            out.set_item(name, array(py, values, &[rows, width])?)?;
        }
        Ok(out)
    }

    /// The key of each stored row of every dynamic table, `{name: uint64 array
    /// [stored]}`, in the order of [`Model::tables`]' rows; empty for hashed tables.
    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let all = self
            .served
            .with_model(|m, source| -> Result<Vec<(String, Vec<u64>)>, String> {
                let sig = Signature::of(m, source).map_err(|e| e.to_string())?;
                let mut out = Vec::new();
                for (t, info) in sig.tables.iter().enumerate() {
                    if let Some(keys) = tables::table_keys(m, t).map_err(|e| e.to_string())? {
                        out.push((info.name.clone(), keys));
                    }
                }
                Ok(out)
            })
            .ok_or_else(|| runtime("no model"))?
            .map_err(runtime)?;
        let out = PyDict::new(py);
        for (name, keys) in all {
            let n = keys.len();
            out.set_item(name, array(py, keys, &[n])?)?;
        }
        Ok(out)
    }

    /// Every dense parameter, `{name: float32 array}`, named and shaped as PyTorch's
    /// modules (`bottom.0.weight` `[out, in]`; the names of `export --format
    /// safetensors`).
    fn weights<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let all = self
            .served
            .with_model(|m, _| params::dense_params(&m.dense))
            .ok_or_else(|| runtime("no model"))?;
        let out = PyDict::new(py);
        for p in all {
            out.set_item(p.name, array(py, p.values, &p.shape)?)?;
        }
        Ok(out)
    }

    /// Click probabilities of `rows`, a list of dicts of raw features as `elastrec serve`
    /// takes them (named features by name, lists as lists; or `I1`..`C26`); a float32
    /// array `[rows, tasks]`. A malformed row is refused naming its row and feature.
    fn predict<'py>(
        &self,
        py: Python<'py>,
        rows: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let rows_json: String = py
            .import("json")?
            .call_method1("dumps", (rows,))?
            .extract()?;
        let body = format!("{{\"rows\": {rows_json}}}");
        let (probs, tasks) = py.detach(|| predict(&self.served, body.as_bytes()))?;
        let n = probs.len() / tasks.max(1);
        array(py, probs, &[n, tasks])
    }

    fn __repr__(&self) -> String {
        format!("elastrec.Model({:?})", self.path)
    }
}

/// Probabilities of a JSON request body and the model's task count.
fn predict(served: &Served, body: &[u8]) -> PyResult<(Vec<f32>, usize)> {
    let bad = |e: String| PyValueError::new_err(e);
    let (probs, tasks, _) = match served.schema() {
        Some(schema) => {
            let batch =
                elastrec_serve::named::batch_from_json(body, &schema, MAX_ROWS).map_err(bad)?;
            served.predict_named(&batch, &schema)
        }
        None => {
            let rows = elastrec_serve::features::rows_from_json(body, MAX_ROWS).map_err(bad)?;
            served.predict_tasks(&rows)
        }
    }
    .map_err(|e| bad(e.to_string()))?;
    Ok((probs, tasks))
}

/// A job's files as batches of numpy arrays, read as `elastrec train` reads them (the
/// job's features, inferred when the job file names none, and its preprocessing).
///
/// Each batch is a dict: `labels` `[n]` (task 0), `task_labels` `[n, tasks - 1]` (more
/// tasks), `weights` `[n]`, `dense` `[n, D]` float32; `sparse` `[n, S]` int64 (each
/// single id's 64-bit key); and per bag or sequence `<name>` `[n, max_len]` int64 (its
/// ids' keys, padded with 0) with `<name>_lengths` `[n]`.
#[pyclass(module = "elastrec")]
struct Batches {
    job: JobConfig,
    files: VecDeque<PathBuf>,
    ready: VecDeque<Batch>,
    lists: Vec<(String, usize)>,
    stats: ReadStats,
}

#[pymethods]
impl Batches {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        while self.ready.is_empty() {
            let Some(file) = self.files.pop_front() else {
                return Ok(None);
            };
            let (job, stats) = (&self.job, &mut self.stats);
            let batches = py.detach(|| {
                elastrec_worker::trainer::load_eval_set(std::slice::from_ref(&file), job, stats)
            });
            self.ready.extend(batches.map_err(runtime)?);
        }
        let b = self.ready.pop_front().expect("not empty");
        batch_dict(py, b, &self.lists).map(Some)
    }

    /// The names of the columns of every batch.
    #[getter]
    fn columns(&self) -> Vec<String> {
        let mut out: Vec<String> = ["labels", "task_labels", "weights", "dense", "sparse"]
            .into_iter()
            .map(String::from)
            .collect();
        for (name, _) in &self.lists {
            out.push(name.clone());
            out.push(format!("{name}_lengths"));
        }
        out
    }

    /// Rows skipped so far by the job's bad-row policy.
    #[getter]
    fn rows_skipped(&self) -> u64 {
        self.stats.rows_skipped
    }
}

fn batch_dict<'py>(
    py: Python<'py>,
    b: Batch,
    lists: &[(String, usize)],
) -> PyResult<Bound<'py, PyDict>> {
    let n = b.len();
    let out = PyDict::new(py);
    let weights = if b.weights.is_empty() {
        vec![1.0f32; n]
    } else {
        b.weights
    };
    out.set_item("labels", array(py, b.labels, &[n])?)?;
    out.set_item(
        "task_labels",
        array(py, b.task_labels, &[n, b.tasks.saturating_sub(1)])?,
    )?;
    out.set_item("weights", array(py, weights, &[n])?)?;
    out.set_item("dense", array(py, b.dense, &[n, b.dense_width])?)?;
    let sparse: Vec<i64> = b.sparse.iter().map(|&k| k as i64).collect();
    out.set_item("sparse", array(py, sparse, &[n, b.sparse_width])?)?;
    for ((name, max_len), bag) in lists.iter().zip(&b.bags) {
        let mut ids = vec![0i64; n * max_len];
        let mut lengths = Vec::with_capacity(n);
        for r in 0..n {
            let row = bag.row(r);
            for (o, &k) in ids[r * max_len..].iter_mut().zip(row) {
                *o = k as i64;
            }
            lengths.push(row.len().min(*max_len) as i64);
        }
        out.set_item(name, array(py, ids, &[n, *max_len])?)?;
        out.set_item(format!("{name}_lengths"), array(py, lengths, &[n])?)?;
    }
    Ok(out)
}

/// Reads `files` (default: the job's training files) of the job file `job` in batches
/// of `batch_size` rows (default: the job's `train.batch_size`).
#[pyfunction]
#[pyo3(signature = (job, files=None, batch_size=None))]
fn read_batches(
    job: PathBuf,
    files: Option<Vec<PathBuf>>,
    batch_size: Option<usize>,
) -> PyResult<Batches> {
    let mut cfg = JobConfig::load(&job).map_err(runtime)?;
    elastrec_job::prepare::resolve_schema(&mut cfg).map_err(runtime)?;
    if let Some(size) = batch_size {
        if size == 0 {
            return Err(PyValueError::new_err("batch_size must be at least 1"));
        }
        cfg.train.batch_size = size;
    }
    let files = files.unwrap_or_else(|| cfg.train_files());
    if let Some(missing) = files.iter().find(|f| !Path::new(f).exists()) {
        return Err(PyValueError::new_err(format!(
            "{}: no such file",
            missing.display()
        )));
    }
    let lists = cfg
        .data
        .schema()
        .map(|s| s.lists().map(|f| (f.name.clone(), f.max_len())).collect())
        .unwrap_or_default();
    Ok(Batches {
        job: cfg,
        files: files.into(),
        ready: VecDeque::new(),
        lists,
        stats: ReadStats::default(),
    })
}

/// The module `elastrec._native`.
#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Model>()?;
    m.add_class::<Batches>()?;
    m.add_function(wrap_pyfunction!(read_batches, m)?)?;
    Ok(())
}
