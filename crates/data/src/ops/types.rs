//! The value types flowing through a chain, and how a null is held in each.
//!
//! Nulls are sentinels, not a separate validity mask, so that every kernel is one
//! branch-free pass over a plain slice:
//! - `int` (`i64`): [`NULL_INT`] (`i64::MIN`; the one integer a column cannot hold);
//! - `float` (`f64`): NaN (an op whose result is not finite yields NaN, i.e. null);
//! - `id` (`u64`): [`NULL_ID`] (`u64::MAX`; hashes and buckets never produce it).

use std::fmt;

/// Null of an `id` column.
pub use crate::columns::NULL_ID;
/// Null of an `int` column.
pub use crate::columns::NULL_INT;

/// The type of a chain's value at one point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    /// One integer per row (a Criteo `I` column).
    Int,
    /// One float per row.
    Float,
    /// One id per row (a Criteo `C` column, a bucket, a hash).
    Id,
    /// A fixed-width list of ids per row (several input columns, n-grams).
    Ids(usize),
    /// A fixed-width vector of floats per row (one-hot, multi-hot).
    Floats(usize),
}

impl ValueType {
    /// Columns the value occupies.
    pub fn width(self) -> usize {
        match self {
            ValueType::Int | ValueType::Float | ValueType::Id => 1,
            ValueType::Ids(w) | ValueType::Floats(w) => w,
        }
    }

    /// The element type of one column.
    pub fn element(self) -> Element {
        match self {
            ValueType::Int => Element::Int,
            ValueType::Float | ValueType::Floats(_) => Element::Float,
            ValueType::Id | ValueType::Ids(_) => Element::Id,
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ValueType::Int => f.write_str("int"),
            ValueType::Float => f.write_str("float"),
            ValueType::Id => f.write_str("id"),
            ValueType::Ids(w) => write!(f, "ids({w})"),
            ValueType::Floats(w) => write!(f, "floats({w})"),
        }
    }
}

/// The element type of one scratch column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Element {
    /// `i64`, null [`NULL_INT`].
    Int,
    /// `f64`, null NaN.
    Float,
    /// `u64`, null [`NULL_ID`].
    Id,
}
