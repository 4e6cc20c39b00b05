//! Embedding tables as dense row-major arrays.

use elastrec_worker::Dlrm;

use crate::error::Result;

/// Every row of table `t` (`rows × row_width` floats: the embedding, then the
/// first-order weight when the model has one). A hashed table stores every row
/// ([`crate::Signature::of`] refuses dynamic ones).
pub fn table_rows(model: &Dlrm, t: usize) -> Result<Vec<f32>> {
    let table = model.embeddings.table(t)?;
    let width = model.embeddings.dim();
    let rows = model.embeddings.config().rows[t];
    let mut out = vec![0.0f32; rows as usize * width];
    for (row, o) in out.chunks_exact_mut(width).enumerate() {
        table.read_weights(row as u64, o)?;
    }
    Ok(out)
}
