//! Saved-model files (`model.bin`), read by `elastrec eval` and `elastrec serve`, and the
//! model deltas (`delta-<from>-<to>.bin`) a running server applies on top of one.
//!
//! Layout of both, all integers little-endian:
//! ```text
//! "ELASTREC-MODEL\0\0"         16-byte magic ("ELASTREC-DELTA\0\0" for a delta)
//! u32 format version (1)
//! u64 header length, header    JSON. A model: the job's model/optimizer config, table rows,
//!                              [[preprocess]] graph (absent: the default graph) and the
//!                              checkpoint it was exported from (absent: from `train`).
//!                              A delta: the checkpoints it goes from and to, table rows.
//! u64 dense length, f32 × len  the dense parameters (flat, DenseDlrm layout), all of them
//! u32 tables, then per table: u64 length, TableSnapshot bytes (rows, weights, state);
//!                              a model holds every row, a delta the rows changed since
//!                              its `from` checkpoint
//! u64 xxh3-64 of every byte before it
//! ```
//! The checksum covers the whole file, so a truncated or corrupted file is refused
//! instead of evaluated or served.

use std::io::Write;
use std::path::Path;

use elastrec_embedding::le::{Reader, Truncated};
use elastrec_embedding::TableSnapshot;
use elastrec_job::config::{JobConfig, ModelConfig, OptimizerConfig};

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::Xxh3;

use crate::error::{Result, WorkerError};
use crate::step::Dlrm;

const MAGIC: &[u8; 16] = b"ELASTREC-MODEL\0\0";
const DELTA_MAGIC: &[u8; 16] = b"ELASTREC-DELTA\0\0";
const VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
struct Header {
    model: ModelConfig,
    optimizer: OptimizerConfig,
    table_rows: Vec<u64>,
    dense_params: usize,
    /// The job's `[[preprocess]]` graph, which a reader of the model applies to raw rows;
    /// absent for the default graph (files written before it existed read the same).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    preprocess: Vec<elastrec_preprocess::FeatureSpec>,
    /// The checkpoint of a `run` job the model was exported from; a delta applies to a
    /// served model only when it starts from this checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    checkpoint: Option<u64>,
    /// The named features the model reads (labels, features, tables); absent for the
    /// Criteo layout. A reader of the model reads its files through them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    schema: Option<elastrec_data::Schema>,
    /// The feature naming each row's user (`data.user`): `eval` of the model reports GAUC
    /// over it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    user: Option<String>,
}

/// What a delta file says about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeltaHeader {
    /// The checkpoint of the model the delta applies to.
    pub from: u64,
    /// The checkpoint the model is at once it is applied.
    pub to: u64,
    /// Samples the model had trained on at `to`.
    pub samples: u64,
    /// Rows of every table (must equal the served model's).
    pub table_rows: Vec<u64>,
    /// Dense parameters (must equal the served model's).
    pub dense_params: usize,
    /// Keys of dynamic tables evicted since `from`: the served model drops them, so it
    /// holds what the job holds (absent in deltas of hashed tables).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evicted: Vec<EvictedKeys>,
}

/// The keys one dynamic table evicted between two checkpoints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvictedKeys {
    /// Table index.
    pub table: usize,
    /// Its keys (global rows) no longer stored.
    pub keys: Vec<u64>,
}

/// A model delta: every dense parameter and the embedding rows changed between two
/// checkpoints of one job.
#[derive(Debug)]
pub struct ModelDelta {
    /// Where it goes from and to.
    pub header: DeltaHeader,
    /// The dense parameters at `to`.
    pub dense: Vec<f32>,
    /// The changed rows of each table, at `to`.
    pub tables: Vec<TableSnapshot>,
}

impl ModelDelta {
    /// The delta from the export `prev` to `model` (checkpoint `to`, `samples` trained):
    /// every dense parameter, and the embedding rows whose weights differ, compared bit
    /// for bit. It is exact whatever checkpoints came between (CPR's prioritized deltas
    /// save only hot rows, and a full checkpoint starts a new chain; neither matters).
    pub fn between(
        prev: &LoadedModel,
        model: &Dlrm,
        to: u64,
        samples: u64,
    ) -> std::result::Result<Self, String> {
        let from = prev
            .checkpoint
            .ok_or("it was not exported from a checkpoint (a `train` model)")?;
        if from >= to {
            return Err(format!("it is of checkpoint {from}, not older than {to}"));
        }
        let rows = &model.embeddings.config().rows;
        if &prev.model.embeddings.config().rows != rows
            || prev.model.dense.num_params() != model.dense.num_params()
            || prev.model.dim() != model.dim()
        {
            return Err("its model has another shape".into());
        }
        let dim = model.dim();
        let mut tables = Vec::new();
        let mut evicted = Vec::new();
        for t in 0..model.embeddings.num_tables() {
            let (new, old) = (
                model.embeddings.table(t).map_err(|e| e.to_string())?,
                prev.model.embeddings.table(t).map_err(|e| e.to_string())?,
            );
            if new.is_dynamic() {
                let gone: Vec<u64> = (0..old.local_rows())
                    .map(|l| old.global_of(l))
                    .filter(|&key| new.local_of(key).is_err())
                    .collect();
                if !gone.is_empty() {
                    evicted.push(EvictedKeys {
                        table: t,
                        keys: gone,
                    });
                }
            }
            let changed: Vec<u64> = if new.is_dynamic() {
                // Slots differ between the two: compare by key. A key the old model lacks
                // compares with its initial value; keys evicted since go in `evicted`.
                let mut was = vec![0.0; dim];
                (0..new.local_rows())
                    .map(|l| new.global_of(l))
                    .filter(|&key| {
                        let now = new.weights(key).expect("a stored key");
                        old.read_weights(key, &mut was).is_err()
                            || now
                                .iter()
                                .zip(&was)
                                .any(|(x, y)| x.to_bits() != y.to_bits())
                    })
                    .collect()
            } else {
                new.data()
                    .chunks_exact(new.stride())
                    .zip(old.data().chunks_exact(old.stride()))
                    .enumerate()
                    .filter(|(_, (a, b))| {
                        a[..dim]
                            .iter()
                            .zip(&b[..dim])
                            .any(|(x, y)| x.to_bits() != y.to_bits())
                    })
                    .map(|(row, _)| new.global_of(row))
                    .collect()
            };
            if !changed.is_empty() {
                tables.push(new.export_rows(&changed).map_err(|e| e.to_string())?);
            }
        }
        Ok(Self {
            header: DeltaHeader {
                from,
                to,
                samples,
                table_rows: rows.clone(),
                dense_params: model.dense.num_params(),
                evicted,
            },
            dense: model.dense.params().to_vec(),
            tables,
        })
    }

    /// Embedding rows carried.
    pub fn rows(&self) -> u64 {
        self.tables.iter().map(|t| t.rows.len() as u64).sum()
    }

    /// Applies the delta to `model`, which must be the model at checkpoint `from` (the
    /// caller checks the checkpoint); the shape is checked here before anything is
    /// written, so a refused delta leaves the model untouched.
    pub fn apply(&self, model: &mut Dlrm) -> std::result::Result<(), String> {
        let h = &self.header;
        if h.table_rows != model.embeddings.config().rows {
            return Err("its tables have other row counts than the served model's".into());
        }
        if h.dense_params != model.dense.num_params() || self.dense.len() != h.dense_params {
            return Err(format!(
                "{} dense parameters, the served model has {}",
                self.dense.len(),
                model.dense.num_params()
            ));
        }
        for snap in &self.tables {
            let table = model
                .embeddings
                .table(snap.table)
                .map_err(|e| e.to_string())?;
            if snap.dim != table.dim() || snap.state_len != table.state_len() {
                return Err(format!(
                    "table {}: rows of {} + {} floats, the served model's have {} + {}",
                    snap.table,
                    snap.dim,
                    snap.state_len,
                    table.dim(),
                    table.state_len()
                ));
            }
            if snap.values.len() != snap.rows.len() * snap.stride() {
                return Err(format!(
                    "table {}: values do not match its rows",
                    snap.table
                ));
            }
            if let Some(r) = snap.rows.iter().find(|&&r| r >= table.rows()) {
                return Err(format!(
                    "table {}: row {r} of {} rows",
                    snap.table,
                    table.rows()
                ));
            }
        }
        for e in &h.evicted {
            let table = model.embeddings.table(e.table).map_err(|e| e.to_string())?;
            if !table.is_dynamic() {
                return Err(format!(
                    "table {}: evicted keys for a table that is not dynamic",
                    e.table
                ));
            }
            if let Some(k) = e.keys.iter().find(|&&k| !table.owns(k)) {
                return Err(format!("table {}: evicted key {k} out of range", e.table));
            }
        }
        model.dense.params_mut().copy_from_slice(&self.dense);
        // Evicted keys first: their slots make room for the changed rows.
        for e in &h.evicted {
            model
                .embeddings
                .table_mut(e.table)
                .and_then(|t| t.remove_keys(&e.keys))
                .map_err(|e| e.to_string())?;
        }
        for snap in &self.tables {
            model
                .embeddings
                .import_table(snap)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// A loaded model file: the model, the job settings it was trained with, and where it
/// came from.
pub struct LoadedModel {
    /// The model.
    pub model: Dlrm,
    /// Model, optimizer and `[[preprocess]]` settings; the rest are defaults.
    pub job: JobConfig,
    /// The checkpoint it was exported from (`None`: written by `train`).
    pub checkpoint: Option<u64>,
}

/// Writes through a hasher so the trailing checksum needs no second pass.
struct HashingWriter<W: Write> {
    inner: W,
    hash: Xxh3,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Saves `model` to `path` atomically ([`elastrec_job::fsio::write_atomic_with`]), so a crash
/// never leaves a half-written model under the final name.
pub fn save(model: &Dlrm, job: &JobConfig, path: &Path) -> Result<()> {
    save_exported(model, job, None, path)
}

/// [`save`] for a model exported from `checkpoint` of a `run` job.
pub fn save_exported(
    model: &Dlrm,
    job: &JobConfig,
    checkpoint: Option<u64>,
    path: &Path,
) -> Result<()> {
    let header = Header {
        model: job.model.clone(),
        optimizer: job.optimizer.clone(),
        table_rows: model.embeddings.config().rows.clone(),
        dense_params: model.dense.num_params(),
        preprocess: job.preprocess.clone(),
        checkpoint,
        schema: job.data.schema(),
        user: job.data.user.clone(),
    };
    let header = serde_json::to_vec(&header).expect("header serializes");
    let tables =
        (0..model.embeddings.num_tables()).map(|t| Ok(model.embeddings.export_table(t)?));
    elastrec_job::fsio::write_atomic_with(path, |out| {
        write_file(MAGIC, &header, model.dense.params(), tables, path, out)
    })
}

/// Writes `delta` to `path` atomically.
pub fn save_delta(delta: &ModelDelta, path: &Path) -> Result<()> {
    let header = serde_json::to_vec(&delta.header).expect("header serializes");
    let tables = delta.tables.iter().map(|t| Ok(t.clone()));
    elastrec_job::fsio::write_atomic_with(path, |out| {
        write_file(DELTA_MAGIC, &header, &delta.dense, tables, path, out)
    })
}

/// Writes a file's bytes (see the module docs) to `out`; `path` only names errors.
fn write_file(
    magic: &[u8; 16],
    header: &[u8],
    params: &[f32],
    tables: impl ExactSizeIterator<Item = Result<TableSnapshot>>,
    path: &Path,
    out: &mut dyn Write,
) -> Result<()> {
    let io = |e| WorkerError::io(path, e);
    let mut w = HashingWriter {
        inner: out,
        hash: Xxh3::new(),
    };
    w.write_all(magic).map_err(io)?;
    w.write_all(&VERSION.to_le_bytes()).map_err(io)?;
    w.write_all(&(header.len() as u64).to_le_bytes())
        .map_err(io)?;
    w.write_all(header).map_err(io)?;
    w.write_all(&(params.len() as u64).to_le_bytes())
        .map_err(io)?;
    for p in params {
        w.write_all(&p.to_le_bytes()).map_err(io)?;
    }
    w.write_all(&(tables.len() as u32).to_le_bytes())
        .map_err(io)?;
    let mut buf = Vec::new();
    for table in tables {
        buf.clear();
        table?.encode(&mut buf);
        w.write_all(&(buf.len() as u64).to_le_bytes()).map_err(io)?;
        w.write_all(&buf).map_err(io)?;
    }
    let digest = w.hash.digest();
    w.inner.write_all(&digest.to_le_bytes()).map_err(io)
}

/// Loads a model saved by [`save`], verifying magic, version, sizes and checksum.
pub fn load(path: &Path) -> Result<(Dlrm, JobConfig)> {
    let m = load_model(path)?;
    Ok((m.model, m.job))
}

/// [`load`], with where the model came from.
pub fn load_model(path: &Path) -> Result<LoadedModel> {
    let bytes = std::fs::read(path).map_err(|e| WorkerError::io(path, e))?;
    model_from_bytes(&bytes, path)
}

/// A model file's bytes, parsed; `path` only names errors (e.g. the bytes came over HTTP).
pub fn model_from_bytes(bytes: &[u8], path: &Path) -> Result<LoadedModel> {
    let bad = |reason: String| WorkerError::ModelFile {
        path: path.to_path_buf(),
        reason,
    };
    let mut file = Sections::open(bytes, MAGIC).map_err(bad)?;
    let header: Header =
        serde_json::from_slice(file.header).map_err(|e| bad(format!("header: {e}")))?;
    let mut job = JobConfig {
        model: header.model,
        optimizer: header.optimizer,
        preprocess: header.preprocess,
        ..JobConfig::default()
    };
    if let Err(e) = elastrec_job::prepare::feature_plan(&job) {
        return Err(bad(format!("header: its [[preprocess]] graph: {e}")));
    }
    if let Some(schema) = header.schema {
        schema
            .validate()
            .map_err(|e| bad(format!("header: its features: the schema {e}")))?;
        job.data.set_schema(schema);
        job.data.user = header.user;
        if let Some(user) = job
            .data
            .user
            .as_ref()
            .filter(|_| job.data.user_slot().is_none())
        {
            return Err(bad(format!(
                "header: its user column {user:?} is not one of its categorical features"
            )));
        }
    }
    let mut model = Dlrm::new(&job, header.table_rows)?;
    let n = file.dense_len().map_err(bad)?;
    if n != model.dense.num_params() || n != header.dense_params {
        return Err(bad(format!(
            "{n} dense parameters stored, the model has {}",
            model.dense.num_params()
        )));
    }
    file.dense(model.dense.params_mut()).map_err(bad)?;
    let tables = file.table_count().map_err(bad)?;
    if tables != model.embeddings.num_tables() {
        return Err(bad(format!(
            "{tables} tables stored, the model has {}",
            model.embeddings.num_tables()
        )));
    }
    for t in 0..tables {
        let snap = file.table()?.map_err(bad)?;
        if snap.table != t {
            return Err(bad(format!("table {t} stored as table {}", snap.table)));
        }
        model.embeddings.import_table(&snap)?;
    }
    file.finish().map_err(bad)?;
    Ok(LoadedModel {
        model,
        job,
        checkpoint: header.checkpoint,
    })
}

/// A delta file's bytes, parsed and checked in itself (not yet against a model: see
/// [`ModelDelta::apply`]); `path` only names errors.
pub fn delta_from_bytes(bytes: &[u8], path: &Path) -> Result<ModelDelta> {
    let bad = |reason: String| WorkerError::ModelFile {
        path: path.to_path_buf(),
        reason,
    };
    let mut file = Sections::open(bytes, DELTA_MAGIC).map_err(bad)?;
    let header: DeltaHeader =
        serde_json::from_slice(file.header).map_err(|e| bad(format!("header: {e}")))?;
    if header.to <= header.from {
        return Err(bad(format!(
            "goes from checkpoint {} back to {}",
            header.from, header.to
        )));
    }
    if let Some(e) = header
        .evicted
        .iter()
        .find(|e| e.table >= header.table_rows.len())
    {
        return Err(bad(format!(
            "evicted keys of table {} of {} tables",
            e.table,
            header.table_rows.len()
        )));
    }
    let n = file.dense_len().map_err(bad)?;
    if n != header.dense_params {
        return Err(bad(format!(
            "{n} dense parameters stored, its header says {}",
            header.dense_params
        )));
    }
    let mut dense = vec![0.0; n];
    file.dense(&mut dense).map_err(bad)?;
    let count = file.table_count().map_err(bad)?;
    let mut tables = Vec::with_capacity(count.min(header.table_rows.len()));
    for _ in 0..count {
        let snap = file.table()?.map_err(bad)?;
        if snap.table >= header.table_rows.len() {
            return Err(bad(format!(
                "table {} of {} tables",
                snap.table,
                header.table_rows.len()
            )));
        }
        tables.push(snap);
    }
    file.finish().map_err(bad)?;
    Ok(ModelDelta {
        header,
        dense,
        tables,
    })
}

/// The sections of a model or delta file, read in order; every size read is checked
/// against the bytes left (sizes from a file or the network are never trusted).
struct Sections<'a> {
    header: &'a [u8],
    r: Reader<'a>,
}

impl<'a> Sections<'a> {
    /// Checks the magic, checksum and version, and reads the header.
    fn open(bytes: &'a [u8], magic: &[u8; 16]) -> Result<Self, String> {
        if bytes.len() < magic.len() + 4 + 8 || &bytes[..magic.len()] != magic {
            let other = if magic == MAGIC { DELTA_MAGIC } else { MAGIC };
            return Err(if bytes.starts_with(other) {
                format!(
                    "a {} file where a {} file was expected",
                    kind(other),
                    kind(magic)
                )
            } else {
                format!("missing magic bytes (not a {} file)", kind(magic))
            });
        }
        let (body, tail) = bytes.split_at(bytes.len() - 8);
        let stored = u64::from_le_bytes(tail.try_into().expect("8 bytes"));
        if xxhash_rust::xxh3::xxh3_64(body) != stored {
            return Err("checksum mismatch (file truncated or corrupted)".into());
        }
        let mut r = Reader::new(&body[magic.len()..]);
        let version = r.u32("version").map_err(short)?;
        if version != VERSION {
            return Err(format!(
                "format version {version}; this build reads {VERSION}"
            ));
        }
        let header_len = read_len(&mut r, "header")?;
        let header = r.take(header_len, "header").map_err(short)?;
        Ok(Self { header, r })
    }

    fn dense_len(&mut self) -> Result<usize, String> {
        let n = read_len(&mut self.r, "dense parameters")?;
        if n > self.r.remaining() / 4 {
            return Err(format!(
                "{n} dense parameters exceed the remaining {} bytes",
                self.r.remaining()
            ));
        }
        Ok(n)
    }

    fn dense(&mut self, out: &mut [f32]) -> Result<(), String> {
        let raw = self
            .r
            .take(out.len() * 4, "dense parameters")
            .map_err(short)?;
        for (p, b) in out.iter_mut().zip(raw.chunks_exact(4)) {
            *p = f32::from_le_bytes(b.try_into().expect("4 bytes"));
        }
        Ok(())
    }

    fn table_count(&mut self) -> Result<usize, String> {
        Ok(self.r.u32("table count").map_err(short)? as usize)
    }

    /// The next table; the outer error is the snapshot's own (bad layout).
    fn table(&mut self) -> Result<Result<TableSnapshot, String>> {
        let len = match read_len(&mut self.r, "table") {
            Ok(len) => len,
            Err(e) => return Ok(Err(e)),
        };
        let bytes = match self.r.take(len, "table") {
            Ok(b) => b,
            Err(e) => return Ok(Err(short(e))),
        };
        Ok(Ok(TableSnapshot::from_bytes(bytes)?))
    }

    fn finish(self) -> Result<(), String> {
        if !self.r.is_empty() {
            return Err(format!("{} unexpected trailing bytes", self.r.remaining()));
        }
        Ok(())
    }
}

fn short(e: Truncated) -> String {
    e.to_string()
}

fn kind(magic: &[u8; 16]) -> &'static str {
    if magic == MAGIC {
        "model"
    } else {
        "model delta"
    }
}

/// A `u64` length prefix, refused unless that many bytes are left.
fn read_len(r: &mut Reader<'_>, what: &str) -> Result<usize, String> {
    let n = r
        .u64("length")
        .map_err(|_| format!("truncated {what} length"))?;
    // Never trust a size read from a file: it must fit in what is left.
    if n > r.remaining() as u64 {
        return Err(format!(
            "{what} length {n} exceeds the remaining {} bytes",
            r.remaining()
        ));
    }
    Ok(n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use elastrec_data::criteo;

    fn saved(dir: &Path) -> (Dlrm, std::path::PathBuf) {
        let job = JobConfig::default();
        let model = Dlrm::new(&job, vec![16; criteo::CATEGORICAL]).unwrap();
        let path = dir.join("model.bin");
        save(&model, &job, &path).unwrap();
        (model, path)
    }

    /// Rewrites the trailing checksum so a deliberately malformed body reaches the parser.
    fn reseal(body: &[u8]) -> Vec<u8> {
        let mut out = body.to_vec();
        out.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(body).to_le_bytes());
        out
    }

    fn load_err(path: &Path, bytes: &[u8]) -> String {
        std::fs::write(path, bytes).unwrap();
        match load(path) {
            Err(WorkerError::ModelFile { reason, .. }) => reason,
            Err(e) => panic!("unexpected error {e}"),
            Ok(_) => panic!("malformed model file loaded"),
        }
    }

    #[test]
    fn round_trip_and_malformed_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (model, path) = saved(dir.path());
        let (loaded, _) = load(&path).unwrap();
        assert_eq!(loaded.dense.params(), model.dense.params());

        let bytes = std::fs::read(&path).unwrap();
        let body = &bytes[..bytes.len() - 8];
        let bad = dir.path().join("bad.bin");
        let mut flipped = bytes.clone();
        flipped[40] ^= 1;
        assert!(load_err(&bad, &flipped).contains("checksum mismatch"));
        // A header length larger than the file, or cut short.
        let header_at = MAGIC.len() + 4;
        let mut long = body.to_vec();
        long[header_at..header_at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        let reason = load_err(&bad, &reseal(&long));
        assert!(
            reason.starts_with("header length 18446744073709551615 exceeds"),
            "{reason}"
        );
        assert!(load_err(&bad, &reseal(&body[..header_at + 3])).contains("truncated header length"));
        // Cut inside the tables, then extra bytes after them.
        assert!(load_err(&bad, &reseal(&body[..body.len() - 1])).contains("table"));
        let mut extra = body.to_vec();
        extra.push(0);
        assert_eq!(
            load_err(&bad, &reseal(&extra)),
            "1 unexpected trailing bytes"
        );
    }
}
