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

    /// Transform applied to a raw integer feature before it enters the model.
    #[inline]
    pub fn transform_dense(raw: i64) -> f32 {
        ((raw.max(0) as f64) + 1.0).ln() as f32
    }
}
