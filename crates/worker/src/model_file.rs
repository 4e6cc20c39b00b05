//! Saved-model files (`model.bin`), read by `elastrec eval`.
//!
//! Layout, all integers little-endian:
//! ```text
//! "ELASTREC-MODEL\0\0"         16-byte magic
//! u32 format version (1)
//! u64 header length, header    JSON: the job's model/optimizer config, table rows and
//!                              [[preprocess]] graph (absent: the default graph)
//! u64 dense length, f32 × len  the dense parameters (flat, DenseDlrm layout)
//! u32 tables, then per table: u64 length, TableSnapshot bytes (rows, weights, state)
//! u64 xxh3-64 of every byte before it
//! ```
//! The checksum covers the whole file, so a truncated or corrupted file is refused
//! instead of evaluated.

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
    elastrec_job::fsio::write_atomic_with(path, |out| write_model(model, job, path, out))
}

/// Writes the file's bytes (see the module docs) to `out`; `path` only names errors.
fn write_model(model: &Dlrm, job: &JobConfig, path: &Path, out: &mut dyn Write) -> Result<()> {
    let io = |e| WorkerError::io(path, e);
    let mut w = HashingWriter {
        inner: out,
        hash: Xxh3::new(),
    };
    let header = Header {
        model: job.model.clone(),
        optimizer: job.optimizer.clone(),
        table_rows: model.embeddings.config().rows.clone(),
        dense_params: model.dense.num_params(),
        preprocess: job.preprocess.clone(),
    };
    let header = serde_json::to_vec(&header).expect("header serializes");
    w.write_all(MAGIC).map_err(io)?;
    w.write_all(&VERSION.to_le_bytes()).map_err(io)?;
    w.write_all(&(header.len() as u64).to_le_bytes())
        .map_err(io)?;
    w.write_all(&header).map_err(io)?;
    let params = model.dense.params();
    w.write_all(&(params.len() as u64).to_le_bytes())
        .map_err(io)?;
    for p in params {
        w.write_all(&p.to_le_bytes()).map_err(io)?;
    }
    let tables = model.embeddings.num_tables();
    w.write_all(&(tables as u32).to_le_bytes()).map_err(io)?;
    let mut buf = Vec::new();
    for t in 0..tables {
        buf.clear();
        model.embeddings.export_table(t)?.encode(&mut buf);
        w.write_all(&(buf.len() as u64).to_le_bytes()).map_err(io)?;
        w.write_all(&buf).map_err(io)?;
    }
    let digest = w.hash.digest();
    w.inner.write_all(&digest.to_le_bytes()).map_err(io)
}

/// Loads a model saved by [`save`], verifying magic, version, sizes and checksum.
pub fn load(path: &Path) -> Result<(Dlrm, JobConfig)> {
    let bytes = std::fs::read(path).map_err(|e| WorkerError::io(path, e))?;
    let bad = |reason: String| WorkerError::ModelFile {
        path: path.to_path_buf(),
        reason,
    };
    if bytes.len() < MAGIC.len() + 4 + 8 || &bytes[..MAGIC.len()] != MAGIC {
        return Err(bad("missing magic bytes (not a model file)".into()));
    }
    let (body, tail) = bytes.split_at(bytes.len() - 8);
    let stored = u64::from_le_bytes(tail.try_into().expect("8 bytes"));
    if xxhash_rust::xxh3::xxh3_64(body) != stored {
        return Err(bad("checksum mismatch (file truncated or corrupted)".into()));
    }
    let short = |e: Truncated| bad(e.to_string());
    let mut r = Reader::new(&body[MAGIC.len()..]);
    let version = r.u32("version").map_err(short)?;
    if version != VERSION {
        return Err(bad(format!(
            "format version {version}; this build reads {VERSION}"
        )));
    }
    let header_len = read_len(&mut r, "header").map_err(bad)?;
    let header: Header = serde_json::from_slice(r.take(header_len, "header").map_err(short)?)
        .map_err(|e| bad(format!("header: {e}")))?;
    let job = JobConfig {
        model: header.model,
        optimizer: header.optimizer,
        preprocess: header.preprocess,
        ..JobConfig::default()
    };
    if let Err(e) = elastrec_job::prepare::feature_plan(&job) {
        return Err(bad(format!("header: its [[preprocess]] graph: {e}")));
    }
    let mut model = Dlrm::new(&job, header.table_rows)?;
    let n = read_len(&mut r, "dense parameters").map_err(bad)?;
    if n != model.dense.num_params() || n != header.dense_params {
        return Err(bad(format!(
            "{n} dense parameters stored, the model has {}",
            model.dense.num_params()
        )));
    }
    let raw = r.take(n * 4, "dense parameters").map_err(short)?;
    for (p, b) in model.dense.params_mut().iter_mut().zip(raw.chunks_exact(4)) {
        *p = f32::from_le_bytes(b.try_into().expect("4 bytes"));
    }
    let tables = r.u32("table count").map_err(short)? as usize;
    if tables != model.embeddings.num_tables() {
        return Err(bad(format!(
            "{tables} tables stored, the model has {}",
            model.embeddings.num_tables()
        )));
    }
    for t in 0..tables {
        let len = read_len(&mut r, "table").map_err(bad)?;
        let snap = TableSnapshot::from_bytes(r.take(len, "table").map_err(short)?)?;
        if snap.table != t {
            return Err(bad(format!("table {t} stored as table {}", snap.table)));
        }
        model.embeddings.import_table(&snap)?;
    }
    if !r.is_empty() {
        return Err(bad(format!("{} unexpected trailing bytes", r.remaining())));
    }
    Ok((model, job))
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
    use elastrec_data::NUM_SPARSE;

    fn saved(dir: &Path) -> (Dlrm, std::path::PathBuf) {
        let job = JobConfig::default();
        let model = Dlrm::new(&job, vec![16; NUM_SPARSE]).unwrap();
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
