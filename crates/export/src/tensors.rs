//! `elastrec export --format safetensors`: every table and dense parameter as a named
//! tensor in one safetensors file, which `safetensors.torch.load_file` (or
//! `safetensors.numpy`) opens without elastrec.
//!
//! Tables are `embedding.<table>` `[rows, dim]` and, for a model with a first-order
//! term, `first_order.<table>` `[rows]`; the dense parameters are named as in
//! [`crate::params`]. The file's metadata holds the model's settings (`elastrec.model`),
//! its inputs (`elastrec.signature`) and the hashing of ids into rows (`elastrec.rows`).

use std::collections::HashMap;
use std::path::Path;

use elastrec_data::Schema;
use elastrec_worker::Dlrm;
use safetensors::tensor::{Dtype, TensorView};

use crate::error::{ExportError, Result};
use crate::signature::Signature;

/// What [`write`] wrote.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TensorsExport {
    /// The file.
    pub path: std::path::PathBuf,
    /// Its bytes.
    pub bytes: u64,
    /// Tensors in it.
    pub tensors: usize,
}

/// Writes `model`'s tables and dense parameters to `path`.
pub fn write(model: &Dlrm, schema: Option<&Schema>, path: &Path) -> Result<TensorsExport> {
    let sig = Signature::of(model, schema)?;
    let c = model.dense.config();
    let (d, width) = (c.embedding_dim, model.embeddings.dim());
    let mut arrays: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    for (t, info) in sig.tables.iter().enumerate() {
        let rows = crate::tables::table_rows(model, t)?;
        let n = info.rows as usize;
        if c.first_order {
            let mut vectors = Vec::with_capacity(n * d);
            let mut first = Vec::with_capacity(n);
            for row in rows.chunks_exact(width) {
                vectors.extend_from_slice(&row[..d]);
                first.push(row[d]);
            }
            arrays.push((format!("embedding.{}", info.name), vec![n, d], vectors));
            arrays.push((format!("first_order.{}", info.name), vec![n], first));
        } else {
            arrays.push((format!("embedding.{}", info.name), vec![n, d], rows));
        }
    }
    for p in crate::params::dense_params(&model.dense) {
        arrays.push((p.name, p.shape, p.values));
    }
    let arrays: Vec<Array<'_>> = arrays
        .iter()
        .map(|(name, shape, values)| {
            (
                name.clone(),
                Dtype::F32,
                shape.clone(),
                bytemuck::cast_slice(values),
            )
        })
        .collect();
    let meta = HashMap::from([
        ("format".to_string(), "elastrec".to_string()),
        (
            "elastrec.model".to_string(),
            serde_json::to_string(c).expect("plain data"),
        ),
        (
            "elastrec.signature".to_string(),
            serde_json::to_string(&sig).expect("plain data"),
        ),
        (
            "elastrec.rows".to_string(),
            crate::onnx::ROWS_RULE.to_string(),
        ),
    ]);
    let tensors = arrays.len();
    write_tensors(arrays, meta, path)?;
    let bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    Ok(TensorsExport {
        path: path.to_path_buf(),
        bytes,
        tensors,
    })
}

/// A tensor to write: its name, element type, shape and little-endian bytes.
pub(crate) type Array<'a> = (String, Dtype, Vec<usize>, &'a [u8]);

/// Writes `arrays` with `meta` to `path` as one safetensors file, atomically; an array
/// whose bytes do not fit its shape is refused by name.
pub(crate) fn write_tensors(
    arrays: Vec<Array<'_>>,
    meta: HashMap<String, String>,
    path: &Path,
) -> Result<()> {
    let failed = |reason: String| ExportError::Safetensors {
        path: path.to_path_buf(),
        reason,
    };
    let mut views = Vec::with_capacity(arrays.len());
    for (name, dtype, shape, bytes) in arrays {
        let view =
            TensorView::new(dtype, shape, bytes).map_err(|e| failed(format!("{name}: {e}")))?;
        views.push((name, view));
    }
    let bytes =
        safetensors::tensor::serialize(views, Some(meta)).map_err(|e| failed(e.to_string()))?;
    Ok(elastrec_job::fsio::write_atomic(path, &bytes)?)
}
