//! Embedding tables as dense row-major arrays.

use elastrec_worker::Dlrm;

use crate::error::{ExportError, Result};

/// Every row of table `t` (`rows × row_width` floats: the embedding, then the
/// first-order weight when the model has one). A hashed table stores every row.
pub fn table_rows(model: &Dlrm, t: usize) -> Result<Vec<f32>> {
    let table = model.embeddings.table(t)?;
    if table.is_dynamic() {
        return Err(ExportError::Unsupported(format!(
            "table {t} is dynamic (model.dynamic_embeddings): its keys span 2^64, so it has \
             no row array to export; train with hashed tables to export this model"
        )));
    }
    let width = model.embeddings.dim();
    let rows = model.embeddings.config().rows[t];
    let mut out = vec![0.0f32; rows as usize * width];
    for (row, o) in out.chunks_exact_mut(width).enumerate() {
        table.read_weights(row as u64, o)?;
    }
    Ok(out)
}
