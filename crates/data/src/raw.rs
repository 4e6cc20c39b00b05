//! Raw (untransformed) Criteo rows: what the TSV parser produces and the writers consume.

use crate::batch::Batch;
use crate::criteo;
use std::sync::OnceLock;

/// One Criteo row before the dense transform: `None` is an empty field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawRow {
    /// Click label (task 0's label of a multi-task row), 0 or 1.
    pub label: u8,
    /// Labels after the first, of a multi-task row (the label field `10` has one):
    /// 0 for a Criteo row, at most [`MAX_EXTRA_TASKS`].
    pub extra_tasks: u8,
    /// Bit `t` is the label of task `t + 1`.
    pub extra_labels: u8,
    /// Integer features `I1..I13`, raw.
    pub ints: [Option<i64>; criteo::DENSE],
    /// Categorical features `C1..C26` as the 32-bit value of their 8 hex digits.
    pub cats: [Option<u32>; criteo::CATEGORICAL],
}

/// Most labels after the first a row can carry (a label field has at most 8 digits).
pub const MAX_EXTRA_TASKS: u8 = 7;

impl RawRow {
    /// Labels the row carries (one per task).
    pub fn tasks(&self) -> usize {
        1 + self.extra_tasks as usize
    }

    /// Appends the row's labels to a row container's: task 0's to `labels`, the others'
    /// to `task_labels` (`tasks - 1` per row). An empty container (`labels` empty) takes
    /// its task count from the row; a row with another count is a reader's error (it
    /// checks every row of a file against the first).
    #[inline]
    pub(crate) fn push_labels(
        &self,
        labels: &mut Vec<f32>,
        tasks: &mut usize,
        task_labels: &mut Vec<f32>,
    ) {
        if labels.is_empty() {
            *tasks = self.tasks();
        }
        debug_assert_eq!(*tasks, self.tasks());
        labels.push(f32::from(self.label));
        task_labels.extend((1..*tasks).map(|t| f32::from(self.task_label(t))));
    }

    /// Task `t`'s label (0 or 1); `t` below [`RawRow::tasks`].
    pub fn task_label(&self, t: usize) -> u8 {
        if t == 0 {
            self.label
        } else {
            (self.extra_labels >> (t - 1)) & 1
        }
    }
}

/// Raw rows in structure-of-arrays form (row-major feature blocks), e.g. for the writers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawBatch {
    /// Labels, 0 or 1.
    pub labels: Vec<u8>,
    /// `len * criteo::DENSE` integer features, row-major.
    pub ints: Vec<Option<i64>>,
    /// `len * criteo::CATEGORICAL` categorical features, row-major.
    pub cats: Vec<Option<u32>>,
    /// Per row, [`RawRow::extra_tasks`] and [`RawRow::extra_labels`] (both empty while
    /// every row has one label).
    pub extra_tasks: Vec<u8>,
    /// See `extra_tasks`.
    pub extra_labels: Vec<u8>,
}

impl RawBatch {
    /// An empty batch with room for `rows` rows.
    pub fn with_capacity(rows: usize) -> Self {
        Self {
            labels: Vec::with_capacity(rows),
            ints: Vec::with_capacity(rows * criteo::DENSE),
            cats: Vec::with_capacity(rows * criteo::CATEGORICAL),
            extra_tasks: Vec::new(),
            extra_labels: Vec::new(),
        }
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True when there is no row.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Drops all rows, keeping capacity.
    pub fn clear(&mut self) {
        self.labels.clear();
        self.ints.clear();
        self.cats.clear();
        self.extra_tasks.clear();
        self.extra_labels.clear();
    }

    /// Appends one row.
    pub fn push(&mut self, row: &RawRow) {
        if row.extra_tasks > 0 && self.extra_tasks.is_empty() {
            // The first multi-task row: the rows before it had one label each.
            self.extra_tasks.resize(self.labels.len(), 0);
            self.extra_labels.resize(self.labels.len(), 0);
        }
        if !self.extra_tasks.is_empty() {
            self.extra_tasks.push(row.extra_tasks);
            self.extra_labels.push(row.extra_labels);
        }
        self.labels.push(row.label);
        self.ints.extend_from_slice(&row.ints);
        self.cats.extend_from_slice(&row.cats);
    }

    /// Row `i` as a [`RawRow`].
    pub fn row(&self, i: usize) -> RawRow {
        let mut r = RawRow {
            label: self.labels[i],
            extra_tasks: self.extra_tasks.get(i).copied().unwrap_or(0),
            extra_labels: self.extra_labels.get(i).copied().unwrap_or(0),
            ..RawRow::default()
        };
        r.ints
            .copy_from_slice(&self.ints[i * criteo::DENSE..(i + 1) * criteo::DENSE]);
        r.cats
            .copy_from_slice(&self.cats[i * criteo::CATEGORICAL..(i + 1) * criteo::CATEGORICAL]);
        r
    }

    /// The transformed model batch for these rows.
    pub fn to_batch(&self) -> Batch {
        let mut b = criteo::batch(self.len());
        for i in 0..self.len() {
            b.push_raw(&self.row(i));
        }
        b
    }
}

const TABLE_SIZE: usize = 4096;

/// [`Batch::transform_dense`] of `0..TABLE_SIZE`.
#[inline]
pub(crate) fn dense_table() -> &'static [f32] {
    static TABLE: OnceLock<Vec<f32>> = OnceLock::new();
    TABLE.get_or_init(|| (0..TABLE_SIZE as i64).map(Batch::transform_dense).collect())
}

/// [`Batch::transform_dense`] through `table` (from [`dense_table`]); bit-identical to it.
#[inline]
pub(crate) fn transform_with(table: &[f32], raw: i64) -> f32 {
    match table.get(raw as u64 as usize) {
        Some(&v) if raw >= 0 => v,
        _ => Batch::transform_dense(raw),
    }
}

/// [`Batch::transform_dense`] with a lookup table for small values; bit-identical to it.
#[inline]
pub(crate) fn transform_dense_fast(raw: i64) -> f32 {
    transform_with(dense_table(), raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_transform_matches_reference() {
        for v in [
            -5i64,
            -1,
            0,
            1,
            2,
            100,
            4095,
            4096,
            1 << 40,
            i64::MAX,
            i64::MIN,
        ] {
            assert_eq!(
                transform_dense_fast(v).to_bits(),
                Batch::transform_dense(v).to_bits()
            );
        }
    }
}
