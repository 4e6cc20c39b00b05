//! Raw rows in column form, the input of a preprocessing plan (`elastrec-preprocess`).
//!
//! A null is a sentinel, so a column is a plain slice every kernel can stream over:
//! [`NULL_INT`] in an integer column, [`NULL_ID`] in a categorical one. The one value this
//! takes away, the integer `-9223372036854775808`, reads as an empty field.

use crate::criteo;
use crate::raw::RawRow;

/// An empty integer field.
pub const NULL_INT: i64 = i64::MIN;
/// An empty categorical field.
pub const NULL_ID: u64 = u64::MAX;

/// Criteo-layout rows as columns: the label, `I1..I13`, `C1..C26`.
#[derive(Debug, Clone, PartialEq)]
pub struct RawColumns {
    /// Click label per row (task 0's of a multi-task row), 0.0 or 1.0.
    pub labels: Vec<f32>,
    /// Labels per row (see [`crate::Batch::tasks`]).
    pub tasks: usize,
    /// The labels of tasks `1..tasks`, `len * (tasks - 1)` row-major.
    pub task_labels: Vec<f32>,
    /// `ints[i]` is column `I(i+1)`.
    pub ints: Vec<Vec<i64>>,
    /// `cats[j]` is column `C(j+1)`, the 32-bit value of its hex digits.
    pub cats: Vec<Vec<u64>>,
}

impl Default for RawColumns {
    fn default() -> Self {
        Self::with_capacity(0)
    }
}

impl RawColumns {
    /// Empty columns with room for `rows` rows.
    pub fn with_capacity(rows: usize) -> Self {
        Self {
            labels: Vec::with_capacity(rows),
            tasks: 1,
            task_labels: Vec::new(),
            ints: (0..criteo::DENSE)
                .map(|_| Vec::with_capacity(rows))
                .collect(),
            cats: (0..criteo::CATEGORICAL)
                .map(|_| Vec::with_capacity(rows))
                .collect(),
        }
    }

    /// Rows held.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True when no row is held.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Drops every row, keeping capacity.
    pub fn clear(&mut self) {
        self.labels.clear();
        self.task_labels.clear();
        self.ints.iter_mut().for_each(Vec::clear);
        self.cats.iter_mut().for_each(Vec::clear);
    }

    /// Appends one row.
    #[inline]
    pub fn push(&mut self, row: &RawRow) {
        row.push_labels(&mut self.labels, &mut self.tasks, &mut self.task_labels);
        for (col, v) in self.ints.iter_mut().zip(&row.ints) {
            col.push(v.unwrap_or(NULL_INT));
        }
        for (col, v) in self.cats.iter_mut().zip(&row.cats) {
            col.push(v.map_or(NULL_ID, u64::from));
        }
    }

    /// Row `i` back as a [`RawRow`].
    pub fn row(&self, i: usize) -> RawRow {
        let x = self.tasks - 1;
        let mut r = RawRow {
            label: self.labels[i] as u8,
            extra_tasks: x as u8,
            extra_labels: self.task_labels[i * x..(i + 1) * x]
                .iter()
                .enumerate()
                .map(|(t, &y)| (y as u8) << t)
                .sum(),
            ..RawRow::default()
        };
        for (slot, col) in r.ints.iter_mut().zip(&self.ints) {
            *slot = (col[i] != NULL_INT).then_some(col[i]);
        }
        for (slot, col) in r.cats.iter_mut().zip(&self.cats) {
            *slot = (col[i] != NULL_ID).then_some(col[i] as u32);
        }
        r
    }
}
