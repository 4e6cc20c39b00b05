//! Saved-model files (`model.bin`), read by `elastrec eval`.
//!
//! Layout, all integers little-endian:
//! ```text
//! "ELASTREC-MODEL\0\0"         16-byte magic
//! u32 format version (1)
//! u64 header length, header    JSON: the job's model/optimizer config and table rows
//! u64 dense length, f32 × len  the dense parameters (flat, DenseDlrm layout)
//! u32 tables, then per table: u64 length, TableSnapshot bytes (rows, weights, state)
//! u64 xxh3-64 of every byte before it
//! ```
//! The checksum covers the whole file, so a truncated or corrupted file is refused
//! instead of evaluated.

use std::io::{Read, Write};
use std::path::Path;

use elastrec_embedding::TableSnapshot;
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::Xxh3;

use crate::config::{JobConfig, ModelConfig, OptimizerConfig};
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

/// Saves `model` to `path` atomically ([`crate::fsio::write_atomic_with`]), so a crash
/// never leaves a half-written model under the final name.
pub fn save(model: &Dlrm, job: &JobConfig, path: &Path) -> Result<()> {
    crate::fsio::write_atomic_with(path, |out| write_model(model, job, path, out))
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
    let mut r = &body[MAGIC.len()..];
    let version = read_u32(&mut r).ok_or_else(|| bad("truncated version".into()))?;
    if version != VERSION {
        return Err(bad(format!(
            "format version {version}; this build reads {VERSION}"
        )));
    }
    let header_len = read_len(&mut r, "header").map_err(bad)?;
    let header: Header = serde_json::from_slice(take(&mut r, header_len, "header").map_err(bad)?)
        .map_err(|e| bad(format!("header: {e}")))?;
    let job = JobConfig {
        model: header.model,
        optimizer: header.optimizer,
        ..JobConfig::default()
    };
    let mut model = Dlrm::new(&job, header.table_rows)?;
    let n = read_len(&mut r, "dense parameters").map_err(bad)?;
    if n != model.dense.num_params() || n != header.dense_params {
        return Err(bad(format!(
            "{n} dense parameters stored, the model has {}",
            model.dense.num_params()
        )));
    }
    let raw = take(&mut r, n * 4, "dense parameters").map_err(bad)?;
    for (p, b) in model.dense.params_mut().iter_mut().zip(raw.chunks_exact(4)) {
        *p = f32::from_le_bytes(b.try_into().expect("4 bytes"));
    }
    let tables = read_u32(&mut r).ok_or_else(|| bad("truncated table count".into()))? as usize;
    if tables != model.embeddings.num_tables() {
        return Err(bad(format!(
            "{tables} tables stored, the model has {}",
            model.embeddings.num_tables()
        )));
    }
    for t in 0..tables {
        let len = read_len(&mut r, "table").map_err(bad)?;
        let snap = TableSnapshot::from_bytes(take(&mut r, len, "table").map_err(bad)?)?;
        if snap.table != t {
            return Err(bad(format!("table {t} stored as table {}", snap.table)));
        }
        model.embeddings.import_table(&snap)?;
    }
    if !r.is_empty() {
        return Err(bad(format!("{} unexpected trailing bytes", r.len())));
    }
    return Ok((model, job));

    fn read_u32(r: &mut &[u8]) -> Option<u32> {
        let mut b = [0u8; 4];
        r.read_exact(&mut b).ok()?;
        Some(u32::from_le_bytes(b))
    }
}

fn read_len(r: &mut &[u8], what: &str) -> Result<usize, String> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)
        .map_err(|_| format!("truncated {what} length"))?;
    let n = u64::from_le_bytes(b);
    // Never trust a size read from a file: it must fit in what is left.
    if n > r.len() as u64 {
        return Err(format!(
            "{what} length {n} exceeds the remaining {} bytes",
            r.len()
        ));
    }
    Ok(n as usize)
}

fn take<'a>(r: &mut &'a [u8], n: usize, what: &str) -> Result<&'a [u8], String> {
    if n > r.len() {
        return Err(format!("truncated {what}"));
    }
    let (head, rest) = r.split_at(n);
    *r = rest;
    Ok(head)
}
