//! The ONNX graph's inputs of a data set, as one safetensors file: what a user feeds
//! ONNX Runtime to reproduce `elastrec eval`'s predictions, and what the suite checks the
//! graph against.

use std::collections::HashMap;
use std::path::Path;

use elastrec_data::schema::NULL_KEY;
use elastrec_data::Batch;
use elastrec_embedding::row_of;
use safetensors::tensor::Dtype;

use crate::error::{ExportError, Result};
use crate::signature::Signature;

/// The inputs of every row added, in order.
pub struct Inputs {
    sig: Signature,
    rows: usize,
    dense: Vec<f32>,
    sparse_rows: Vec<i64>,
    list_rows: Vec<Vec<i64>>,
    list_weights: Vec<Vec<f32>>,
}

impl Inputs {
    /// No rows yet, for a model of signature `sig`.
    pub fn new(sig: Signature) -> Self {
        let lists = sig.lists.len();
        Self {
            sig,
            rows: 0,
            dense: Vec::new(),
            sparse_rows: Vec::new(),
            list_rows: vec![Vec::new(); lists],
            list_weights: vec![Vec::new(); lists],
        }
    }

    /// Rows added.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Adds the rows of `batch` (read with the model's schema).
    pub fn push(&mut self, batch: &Batch) -> Result<()> {
        let sig = &self.sig;
        if batch.dense_width != sig.dense.len()
            || batch.sparse_width != sig.singles.len()
            || batch.bags.len() != sig.lists.len()
        {
            return Err(ExportError::Shape(format!(
                "a batch of {} dense, {} single-id and {} list features for a model of {}, \
                 {} and {}",
                batch.dense_width,
                batch.sparse_width,
                batch.bags.len(),
                sig.dense.len(),
                sig.singles.len(),
                sig.lists.len()
            )));
        }
        self.dense.extend_from_slice(&batch.dense);
        // A hashed table's row, or a dynamic table's key (its bits, as ONNX has no
        // unsigned 64-bit lookups).
        let row = |table: usize, key: u64| row_of(table, key, sig.tables[table].key_space()) as i64;
        for ids in batch.sparse.chunks_exact(batch.sparse_width.max(1)) {
            for (slot, &id) in sig.singles.iter().zip(ids) {
                self.sparse_rows.push(row(slot.table, id));
            }
        }
        for (b, (list, bag)) in sig.lists.iter().zip(&batch.bags).enumerate() {
            let (rows_out, weights_out) = (&mut self.list_rows[b], &mut self.list_weights[b]);
            for r in 0..batch.len() {
                let ids = bag.row(r);
                if ids.len() > list.max_len {
                    return Err(ExportError::Shape(format!(
                        "feature `{}` has a list of {} ids where the model takes {}",
                        list.feature,
                        ids.len(),
                        list.max_len
                    )));
                }
                let weights = bag.row_weights(r);
                let start = rows_out.len();
                if ids.is_empty() {
                    rows_out.push(row(list.table, NULL_KEY));
                    weights_out.push(1.0);
                } else {
                    // A learned pooling weighs the items itself: 1 marks an item present.
                    let learned = list.pooling.is_learned();
                    for (i, &id) in ids.iter().enumerate() {
                        rows_out.push(row(list.table, id));
                        let w = if learned { None } else { weights.get(i) };
                        weights_out.push(w.copied().unwrap_or(1.0));
                    }
                }
                // Padding: row 0, weight 0.
                rows_out.resize(start + list.max_len, 0);
                weights_out.resize(start + list.max_len, 0.0);
            }
        }
        self.rows += batch.len();
        Ok(())
    }

    /// Writes the inputs to `path` (safetensors: `dense`, `sparse_rows`, and each list's
    /// `<feature>_rows` and `<feature>_weights`).
    pub fn write(&self, path: &Path) -> Result<()> {
        let sig = &self.sig;
        let n = self.rows;
        let mut arrays: Vec<crate::tensors::Array<'_>> = vec![(
            "dense".into(),
            Dtype::F32,
            vec![n, sig.dense.len()],
            bytemuck::cast_slice(&self.dense),
        )];
        if !sig.singles.is_empty() {
            arrays.push((
                "sparse_rows".into(),
                Dtype::I64,
                vec![n, sig.singles.len()],
                bytemuck::cast_slice(&self.sparse_rows),
            ));
        }
        for (b, list) in sig.lists.iter().enumerate() {
            let shape = vec![n, list.max_len];
            arrays.push((
                sig.list_rows(b),
                Dtype::I64,
                shape.clone(),
                bytemuck::cast_slice(&self.list_rows[b]),
            ));
            arrays.push((
                sig.list_weights(b),
                Dtype::F32,
                shape,
                bytemuck::cast_slice(&self.list_weights[b]),
            ));
        }
        let meta = HashMap::from([("format".to_string(), "elastrec-onnx-inputs".to_string())]);
        crate::tensors::write_tensors(arrays, meta, path)
    }
}
