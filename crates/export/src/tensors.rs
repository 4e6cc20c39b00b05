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
    let mut views = Vec::with_capacity(arrays.len());
    for (name, shape, values) in &arrays {
        let view = TensorView::new(Dtype::F32, shape.clone(), bytemuck::cast_slice(values))
            .map_err(|e| ExportError::Safetensors {
                path: path.to_path_buf(),
                reason: format!("{name}: {e}"),
            })?;
        views.push((name.clone(), view));
    }
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
    let tensors = views.len();
    write_tensors(views, meta, path)?;
    let bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    Ok(TensorsExport {
        path: path.to_path_buf(),
        bytes,
        tensors,
    })
}

/// Writes named tensor views with `meta` to `path`, atomically.
pub(crate) fn write_tensors(
    views: Vec<(String, TensorView<'_>)>,
    meta: HashMap<String, String>,
    path: &Path,
) -> Result<()> {
    let bytes = safetensors::tensor::serialize(views, Some(meta)).map_err(|e| {
        ExportError::Safetensors {
            path: path.to_path_buf(),
            reason: e.to_string(),
        }
    })?;
    crate::onnx::write_atomically(path, &bytes)
}
