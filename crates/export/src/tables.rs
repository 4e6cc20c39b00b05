//! Embedding tables as dense row-major arrays.

use elastrec_worker::Dlrm;

use crate::error::Result;

/// Every row of table `t` (`rows × row_width` floats: the embedding, then the
/// first-order weight when the model has one).
///
/// A hashed table gives all its rows. A dynamic table gives the rows it stores, in slot
/// order ([`table_keys`] gives their keys), then one row of zeros: what an export reads
/// for a key the table never admitted (elastrec reads that key's seeded initial value,
/// at most the table's init bound in each coordinate, which no ONNX operator computes).
pub fn table_rows(model: &Dlrm, t: usize) -> Result<Vec<f32>> {
    let table = model.embeddings.table(t)?;
    let width = model.embeddings.dim();
    let (rows, stored) = if table.is_dynamic() {
        (table.local_rows() + 1, table.local_rows())
    } else {
        let rows = model.embeddings.config().rows[t] as usize;
        (rows, rows)
    };
    let mut out = vec![0.0f32; rows * width];
    for (local, o) in out.chunks_exact_mut(width).take(stored).enumerate() {
        table.read_weights(table.global_of(local), o)?;
    }
    Ok(out)
}

/// The key of each row a dynamic table `t` stores, in [`table_rows`]' order; `None` for
/// a hashed table, whose row is its key's hash (`crate::onnx::ROWS_RULE`).
pub fn table_keys(model: &Dlrm, t: usize) -> Result<Option<Vec<u64>>> {
    let table = model.embeddings.table(t)?;
    if !table.is_dynamic() {
        return Ok(None);
    }
    Ok(Some(
        (0..table.local_rows())
            .map(|l| table.global_of(l))
            .collect(),
    ))
}
