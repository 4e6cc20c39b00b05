//! `elastrec export --format safetensors`: every table and dense parameter as a named
//! tensor in one safetensors file, which `safetensors.torch.load_file` (or
//! `safetensors.numpy`) opens without elastrec.
//!
//! Tables are `embedding.<table>` `[rows, dim]` and, for a model with a first-order
//! term, `first_order.<table>` `[rows]`. A dynamic table's rows are the ones it stores,
//! then one of zeros (for keys it never admitted), and `embedding.<table>.keys`
//! `[stored]` (uint64) holds each stored row's key. The dense parameters are named as in
//! [`crate::params`]. The file's metadata holds the model's settings (`elastrec.model`),
//! its inputs (`elastrec.signature`) and the hashing of ids into rows (`elastrec.rows`).

use std::collections::HashMap;
use std::path::Path;

use elastrec_data::FeatureSource;
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

/// Writes `model`'s tables and dense parameters (its inputs from `source`) to `path`.
pub fn write(model: &Dlrm, source: FeatureSource<'_>, path: &Path) -> Result<TensorsExport> {
    let sig = Signature::of(model, source)?;
    let c = model.dense.config();
    let (d, width) = (c.embedding_dim, model.embeddings.dim());
    let mut arrays: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    let mut keys: Vec<(String, Vec<u64>)> = Vec::new();
    for (t, info) in sig.tables.iter().enumerate() {
        let rows = crate::tables::table_rows(model, t)?;
        if let Some(k) = crate::tables::table_keys(model, t)? {
            keys.push((format!("embedding.{}.keys", info.name), k));
        }
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
        .chain(keys.iter().map(|(name, k)| {
            (
                name.clone(),
                Dtype::U64,
                vec![k.len()],
                bytemuck::cast_slice(k),
            )
        }))
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
    let mut bytes =
        safetensors::tensor::serialize(views, Some(meta)).map_err(|e| failed(e.to_string()))?;
    sort_header(&mut bytes).map_err(failed)?;
    Ok(elastrec_job::fsio::write_atomic(path, &bytes)?)
}

/// Rewrites the JSON header of the safetensors file `bytes` with its keys sorted, so that
/// two exports of one model are the same bytes (the library writes its metadata from a
/// `HashMap`, in an order that changes from run to run). Every tensor's entry carries
/// its own data offsets, so the order of the keys is free; the header keeps its length.
fn sort_header(bytes: &mut [u8]) -> std::result::Result<(), String> {
    let len = bytes
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize)
        .ok_or("no header length")?;
    let header = bytes.get_mut(8..8 + len).ok_or("a header past the end")?;
    // serde_json's maps are sorted by key (its `preserve_order` feature is off).
    let value: serde_json::Value =
        serde_json::from_slice(header).map_err(|e| format!("header: {e}"))?;
    let sorted = serde_json::to_vec(&value).map_err(|e| format!("header: {e}"))?;
    if sorted.len() > header.len() {
        return Err("the sorted header is longer than the written one".into());
    }
    header[..sorted.len()].copy_from_slice(&sorted);
    header[sorted.len()..].fill(b' ');
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The library writes the metadata in a `HashMap`'s order; the file does not depend
    /// on it.
    #[test]
    fn two_writes_of_the_same_tensors_are_the_same_bytes_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let values = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let write = |name: &str| {
            let meta: HashMap<String, String> = (0..8)
                .map(|i| (format!("key{i}"), format!("value {i}")))
                .collect();
            let arrays: Vec<Array<'_>> = vec![
                (
                    "b".into(),
                    Dtype::F32,
                    vec![2, 3],
                    bytemuck::cast_slice(&values),
                ),
                (
                    "a".into(),
                    Dtype::F32,
                    vec![6],
                    bytemuck::cast_slice(&values),
                ),
            ];
            let path = dir.path().join(name);
            write_tensors(arrays, meta, &path).unwrap();
            std::fs::read(path).unwrap()
        };
        let (one, two) = (write("one.safetensors"), write("two.safetensors"));
        assert_eq!(one, two);
        let (_, header) = safetensors::SafeTensors::read_metadata(&one).unwrap();
        assert_eq!(header.metadata().as_ref().unwrap()["key7"], "value 7");
        let read = safetensors::SafeTensors::deserialize(&one).unwrap();
        let b = read.tensor("b").unwrap();
        assert_eq!(b.shape(), [2, 3]);
        assert_eq!(b.data(), bytemuck::cast_slice::<f32, u8>(&values));
    }
}
