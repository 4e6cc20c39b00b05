//! The in-memory batch every reader fills and every trainer consumes.

/// Value stored for an empty categorical field. Real values are 32-bit (8 hex digits), so
/// this sentinel can never collide with one.
pub const MISSING_CATEGORY: u64 = 1 << 32;

/// [`Batch::check_tasks`] for any row container: `rows` rows of `got` labels each.
pub fn check_tasks(
    rows: usize,
    got: usize,
    expected: usize,
    path: &std::path::Path,
) -> crate::Result<()> {
    if rows == 0 || got == expected {
        return Ok(());
    }
    Err(crate::DataError::TaskCount {
        path: path.to_path_buf(),
        got,
        expected,
    })
}

/// A batch of samples in structure-of-arrays form, of the widths its reader gives it.
///
/// Buffers are reused across batches (`clear` keeps capacity), so readers fill them without
/// per-row allocation. Whoever fills a batch sets its layout: a named schema's reader its
/// features, a preprocessing plan (`elastrec-preprocess`) its outputs, a reader of the
/// Criteo preset [`crate::criteo`]'s widths. A new batch has no features until then.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// Click label per sample (task 0's of a multi-task batch), 0.0 or 1.0.
    pub labels: Vec<f32>,
    /// Labels per sample: 1, or a multi-task data set's count (the label field `10`
    /// holds two). A batch takes it from its first row; a reader keeps a file's rows
    /// alike.
    pub tasks: usize,
    /// The labels of tasks `1..tasks`, `len * (tasks - 1)` row-major (empty for one).
    pub task_labels: Vec<f32>,
    /// Each sample's weight in the loss (`data.weight`), `len` values; empty when the data
    /// has no weight column: 1 each.
    pub weights: Vec<f32>,
    /// `len * dense_width` values, row-major, already transformed (the Criteo preset's
    /// integers as `ln(1 + max(x, 0))`, a schema's or plan's by their chains); an empty
    /// field is 0.
    pub dense: Vec<f32>,
    /// `len * sparse_width` categorical ids, row-major (a Criteo category's 8 hex digits
    /// parsed as an integer, a schema's ids as its features key them),
    /// `MISSING_CATEGORY` for an empty field.
    pub sparse: Vec<u64>,
    /// Dense features per row.
    pub dense_width: usize,
    /// Categorical features (embedding tables) per row.
    pub sparse_width: usize,
    /// Multi-valued features (embedding bags and sequences) of a named schema, one
    /// [`Jagged`] column each, after the `sparse_width` single-valued ones; empty for the
    /// Criteo layout and preprocessing plans.
    pub bags: Vec<Jagged>,
}

/// One multi-valued feature of a batch: row `i`'s ids are
/// `ids[offsets[i]..offsets[i + 1]]`, in the order the data gives them (a sequence's
/// order is kept). `offsets` starts at 0 and has one entry more than the batch has rows.
/// Buffers keep their capacity across batches, so a reader fills them without allocating
/// per row.
#[derive(Debug, Clone, PartialEq)]
pub struct Jagged {
    /// Start of each row's ids in `ids`, and the end of the last.
    pub offsets: Vec<u32>,
    /// Every row's ids, back to back.
    pub ids: Vec<u64>,
    /// Per-id weights (same length as `ids`), or empty when every id weighs 1.
    pub weights: Vec<f32>,
}

impl Default for Jagged {
    fn default() -> Self {
        Self {
            offsets: vec![0],
            ids: Vec::new(),
            weights: Vec::new(),
        }
    }
}

impl Jagged {
    /// Rows held.
    pub fn rows(&self) -> usize {
        self.offsets.len() - 1
    }

    /// The ids of row `i`.
    pub fn row(&self, i: usize) -> &[u64] {
        &self.ids[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }

    /// The weights of row `i` (empty when the column has none).
    pub fn row_weights(&self, i: usize) -> &[f32] {
        if self.weights.is_empty() {
            return &[];
        }
        &self.weights[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }

    /// Ends the current row (whose ids were pushed since the last call).
    ///
    /// # Panics
    /// If the column holds more than `u32::MAX` ids (a batch is far smaller).
    #[inline]
    pub fn end_row(&mut self) {
        let end = u32::try_from(self.ids.len()).expect("a batch holds under 2^32 list items");
        self.offsets.push(end);
    }

    /// Drops every row, keeping the capacity.
    pub fn clear(&mut self) {
        self.offsets.truncate(1);
        self.ids.clear();
        self.weights.clear();
    }

    /// Appends rows `range` of `other`.
    pub fn extend_from(&mut self, other: &Jagged, range: std::ops::Range<usize>) {
        let (from, to) = (
            other.offsets[range.start] as usize,
            other.offsets[range.end] as usize,
        );
        if !other.weights.is_empty() {
            // Rows without weights weigh 1.
            self.weights.resize(self.ids.len(), 1.0);
            self.weights.extend_from_slice(&other.weights[from..to]);
        } else if !self.weights.is_empty() {
            self.weights.resize(self.ids.len() + (to - from), 1.0);
        }
        self.ids.extend_from_slice(&other.ids[from..to]);
        let base = self.offsets.last().copied().unwrap_or(0);
        let shift = |o: u32| base + (o - other.offsets[range.start]);
        self.offsets.extend(
            other.offsets[range.start + 1..=range.end]
                .iter()
                .map(|&o| shift(o)),
        );
    }

    /// Keeps the first `rows` rows.
    pub fn truncate(&mut self, rows: usize) {
        if rows >= self.rows() {
            return;
        }
        self.offsets.truncate(rows + 1);
        let end = self.offsets[rows] as usize;
        self.ids.truncate(end);
        if !self.weights.is_empty() {
            self.weights.truncate(end);
        }
    }

    /// Appends row `i` of `other` as a new row.
    pub fn push_row_of(&mut self, other: &Jagged, i: usize) {
        self.extend_from(other, i..i + 1);
    }
}

impl Default for Batch {
    /// An empty batch of no features, for a reader to give its layout.
    fn default() -> Self {
        Self::with_widths(0, 0, 0)
    }
}

impl Batch {
    /// An empty batch of `dense_width` dense and `sparse_width` categorical features per
    /// row, with room for `rows` samples.
    pub fn with_widths(rows: usize, dense_width: usize, sparse_width: usize) -> Self {
        Self {
            labels: Vec::with_capacity(rows),
            tasks: 1,
            task_labels: Vec::new(),
            weights: Vec::new(),
            dense: Vec::with_capacity(rows * dense_width),
            sparse: Vec::with_capacity(rows * sparse_width),
            dense_width,
            sparse_width,
            bags: Vec::new(),
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
        self.task_labels.clear();
        self.weights.clear();
        self.dense.clear();
        self.sparse.clear();
        self.bags.iter_mut().for_each(Jagged::clear);
    }

    /// Gives this batch `other`'s layout (widths, tasks and bag columns), for an empty
    /// batch about to take `other`'s rows.
    pub fn take_layout(&mut self, other: &Batch) {
        self.tasks = other.tasks;
        self.dense_width = other.dense_width;
        self.sparse_width = other.sparse_width;
        self.bags.resize_with(other.bags.len(), Jagged::default);
        self.bags.iter_mut().for_each(Jagged::clear);
    }

    /// Appends one raw row (label, raw integers, raw categorical values), applying
    /// [`Batch::transform_dense`] to the integers and [`MISSING_CATEGORY`] to empty
    /// categorical fields. Does not allocate once the buffers have grown.
    ///
    /// This is the Criteo preset's preprocessing; the batch must have its layout
    /// ([`crate::criteo::batch`], [`crate::criteo::set_layout`]).
    #[inline]
    pub fn push_raw(&mut self, row: &crate::raw::RawRow) {
        debug_assert!(
            self.dense_width == crate::criteo::DENSE
                && self.sparse_width == crate::criteo::CATEGORICAL
        );
        row.push_labels(&mut self.labels, &mut self.tasks, &mut self.task_labels);
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

    /// Appends the rows `range` of `other` to this batch (an empty batch takes `other`'s
    /// layout: widths, task count and bag columns).
    ///
    /// # Panics
    /// If both hold rows and their task counts differ.
    pub fn extend_from(&mut self, other: &Batch, range: std::ops::Range<usize>) {
        if self.is_empty() {
            self.tasks = other.tasks;
            self.dense_width = other.dense_width;
            self.sparse_width = other.sparse_width;
            if self.bags.len() != other.bags.len() {
                self.bags.resize_with(other.bags.len(), Jagged::default);
            }
        }
        debug_assert!(
            self.dense_width == other.dense_width && self.sparse_width == other.sparse_width
        );
        assert_eq!(self.tasks, other.tasks, "rows of different task counts");
        let (d, s) = (other.dense_width, other.sparse_width);
        let x = other.tasks - 1;
        self.task_labels
            .extend_from_slice(&other.task_labels[range.start * x..range.end * x]);
        // Weights are kept once either side has them (rows without count 1).
        if !(self.weights.is_empty() && other.weights.is_empty()) {
            self.weights.resize(self.len(), 1.0);
            if other.weights.is_empty() {
                self.weights.resize(self.len() + range.len(), 1.0);
            } else {
                self.weights
                    .extend_from_slice(&other.weights[range.clone()]);
            }
        }
        self.labels.extend_from_slice(&other.labels[range.clone()]);
        self.dense
            .extend_from_slice(&other.dense[range.start * d..range.end * d]);
        self.sparse
            .extend_from_slice(&other.sparse[range.start * s..range.end * s]);
        debug_assert_eq!(self.bags.len(), other.bags.len());
        for (mine, theirs) in self.bags.iter_mut().zip(&other.bags) {
            mine.extend_from(theirs, range.clone());
        }
    }

    /// Keeps the first `rows` samples.
    pub fn truncate(&mut self, rows: usize) {
        self.labels.truncate(rows);
        self.task_labels.truncate(rows * (self.tasks - 1));
        self.weights.truncate(rows);
        self.dense.truncate(rows * self.dense_width);
        self.sparse.truncate(rows * self.sparse_width);
        for bag in &mut self.bags {
            bag.truncate(rows);
        }
    }

    /// The dense features of row `i`.
    pub fn dense_row(&self, i: usize) -> &[f32] {
        &self.dense[i * self.dense_width..(i + 1) * self.dense_width]
    }

    /// The labels of tasks `1..tasks` of row `i` (empty for one task).
    pub fn task_labels_row(&self, i: usize) -> &[f32] {
        let x = self.tasks - 1;
        &self.task_labels[i * x..(i + 1) * x]
    }

    /// The categorical features of row `i`.
    pub fn sparse_row(&self, i: usize) -> &[u64] {
        &self.sparse[i * self.sparse_width..(i + 1) * self.sparse_width]
    }

    /// Checks that rows read from `path` carry one label per task of a model with
    /// `tasks` tasks ([`DataError::TaskCount`] otherwise); an empty batch passes.
    pub fn check_tasks(&self, tasks: usize, path: &std::path::Path) -> crate::Result<()> {
        check_tasks(self.len(), self.tasks, tasks, path)
    }

    /// Transform applied to a raw integer feature before it enters the model.
    #[inline]
    pub fn transform_dense(raw: i64) -> f32 {
        ((raw.max(0) as f64) + 1.0).ln() as f32
    }
}
