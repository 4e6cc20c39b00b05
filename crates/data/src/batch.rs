//! The in-memory batch every reader fills and every trainer consumes.

/// Number of integer (dense) features in the Criteo layout.
pub const NUM_DENSE: usize = 13;
/// Number of categorical features in the Criteo layout.
pub const NUM_SPARSE: usize = 26;
/// Value stored for an empty categorical field. Real values are 32-bit (8 hex digits), so
/// this sentinel can never collide with one.
pub const MISSING_CATEGORY: u64 = 1 << 32;

/// A batch of Criteo-layout samples in structure-of-arrays form.
///
/// Buffers are reused across batches (`clear` keeps capacity), so readers fill them without
/// per-row allocation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    /// Click label per sample, 0.0 or 1.0.
    pub labels: Vec<f32>,
    /// `len * NUM_DENSE` values, row-major, already transformed as `ln(1 + max(x, 0))`;
    /// an empty field is 0.
    pub dense: Vec<f32>,
    /// `len * NUM_SPARSE` raw categorical values, row-major (the 8-hex-digit value parsed
    /// as an integer), `MISSING_CATEGORY` for an empty field.
    pub sparse: Vec<u64>,
}

impl Batch {
    /// An empty batch with room for `rows` samples.
    pub fn with_capacity(rows: usize) -> Self {
        Self {
            labels: Vec::with_capacity(rows),
            dense: Vec::with_capacity(rows * NUM_DENSE),
            sparse: Vec::with_capacity(rows * NUM_SPARSE),
        }
    }

    /// Number of samples in the batch.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True when the batch holds no sample.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Drops all samples, keeping the allocated capacity.
    pub fn clear(&mut self) {
        self.labels.clear();
        self.dense.clear();
        self.sparse.clear();
    }

    /// Appends one raw row (label, raw integers, raw categorical values), applying
    /// [`Batch::transform_dense`] to the integers and [`MISSING_CATEGORY`] to empty
    /// categorical fields. Does not allocate once the buffers have grown.
    #[inline]
    pub fn push_raw(&mut self, row: &crate::raw::RawRow) {
        self.labels.push(row.label as f32);
        let table = crate::raw::dense_table();
        self.dense.extend(
            row.ints
                .iter()
                .map(|v| crate::raw::transform_with(table, v.unwrap_or(0))),
        );
        self.sparse.extend(
            row.cats
                .iter()
                .map(|c| c.map_or(MISSING_CATEGORY, u64::from)),
        );
    }

    /// Appends the rows `range` of `other` to this batch.
    pub fn extend_from(&mut self, other: &Batch, range: std::ops::Range<usize>) {
        self.labels.extend_from_slice(&other.labels[range.clone()]);
        self.dense
            .extend_from_slice(&other.dense[range.start * NUM_DENSE..range.end * NUM_DENSE]);
        self.sparse
            .extend_from_slice(&other.sparse[range.start * NUM_SPARSE..range.end * NUM_SPARSE]);
    }

    /// The dense features of row `i`.
    pub fn dense_row(&self, i: usize) -> &[f32] {
        &self.dense[i * NUM_DENSE..(i + 1) * NUM_DENSE]
    }

    /// The categorical features of row `i`.
    pub fn sparse_row(&self, i: usize) -> &[u64] {
        &self.sparse[i * NUM_SPARSE..(i + 1) * NUM_SPARSE]
    }

    /// Transform applied to a raw integer feature before it enters the model.
    #[inline]
    pub fn transform_dense(raw: i64) -> f32 {
        ((raw.max(0) as f64) + 1.0).ln() as f32
    }
}
