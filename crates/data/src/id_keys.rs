//! An id column's values as 64-bit keys, and the keys of one Arrow batch's id columns
//! decoded once however many features read them.

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef};
use arrow_schema::DataType;

use crate::named::Columns;
use crate::schema::{string_key, NULL_KEY};

/// The keys of the id columns of one Arrow batch: hashing a string column's ids is most
/// of a reader's cost, and several features may read one column (a history and its
/// n-grams, an id hashed two ways). A column that several features read is decoded once
/// per batch and kept for the others; any other is decoded into one reused buffer, which
/// stays in cache. Buffers are kept across batches.
#[derive(Debug, Default)]
pub(crate) struct DecodedKeys {
    /// The columns that more than one id feature reads.
    shared: Vec<usize>,
    /// The keys of each shared column, and whether they are this batch's.
    decoded: Vec<(Vec<u64>, bool)>,
    /// The keys of the column decoded last, when it is read by one feature only.
    scratch: Vec<u64>,
}

impl DecodedKeys {
    /// Keys for the id columns `c` addresses (single ids and lists).
    pub(crate) fn new(c: &Columns) -> Self {
        let mut ids: Vec<usize> = c
            .cats
            .iter()
            .copied()
            .chain(c.lists.iter().map(|l| l.0))
            .collect();
        ids.sort_unstable();
        let mut shared: Vec<usize> = ids
            .windows(2)
            .filter(|w| w[0] == w[1])
            .map(|w| w[0])
            .collect();
        shared.dedup();
        Self {
            decoded: vec![(Vec::new(), false); shared.len()],
            shared,
            scratch: Vec::new(),
        }
    }

    /// Forgets the previous batch's keys, keeping their buffers.
    pub(crate) fn clear(&mut self) {
        self.decoded
            .iter_mut()
            .for_each(|(_, fresh)| *fresh = false);
    }

    /// The keys of column `index` (whose values are `values`: the column itself, or a
    /// list column's items): a shared column's decoded on its first call of this batch.
    pub(crate) fn of(&mut self, index: usize, values: &ArrayRef) -> &[u64] {
        let Some(s) = self.shared.iter().position(|&c| c == index) else {
            keys(values, &mut self.scratch);
            return &self.scratch;
        };
        let (out, fresh) = &mut self.decoded[s];
        if !*fresh {
            keys(values, out);
            *fresh = true;
        }
        out
    }

    /// Column `index`'s keys into `dst`: decoded straight into it unless shared.
    pub(crate) fn copy(&mut self, index: usize, col: &ArrayRef, dst: &mut Vec<u64>) {
        if self.shared.contains(&index) {
            dst.clear();
            dst.extend_from_slice(self.of(index, col));
        } else {
            keys(col, dst);
        }
    }
}

/// Every value of an id column as a 64-bit key (null: [`NULL_KEY`]).
pub(crate) fn keys(col: &ArrayRef, out: &mut Vec<u64>) {
    out.clear();
    macro_rules! prim {
        ($t:ty) => {
            out.extend(
                col.as_primitive::<$t>()
                    .iter()
                    .map(|v| v.map_or(NULL_KEY, |v| v as i64 as u64)),
            )
        };
    }
    macro_rules! unsigned {
        ($t:ty) => {
            out.extend(
                col.as_primitive::<$t>()
                    .iter()
                    .map(|v| v.map_or(NULL_KEY, u64::from)),
            )
        };
    }
    macro_rules! strings {
        ($a:expr) => {
            out.extend(
                $a.iter()
                    .map(|v| v.map_or(NULL_KEY, |s| string_key(s.as_bytes()))),
            )
        };
    }
    match col.data_type() {
        DataType::Int8 => prim!(Int8Type),
        DataType::Int16 => prim!(Int16Type),
        DataType::Int32 => prim!(Int32Type),
        DataType::Int64 => prim!(Int64Type),
        DataType::UInt8 => unsigned!(UInt8Type),
        DataType::UInt16 => unsigned!(UInt16Type),
        DataType::UInt32 => unsigned!(UInt32Type),
        DataType::UInt64 => out.extend(
            col.as_primitive::<UInt64Type>()
                .iter()
                .map(|v| v.unwrap_or(NULL_KEY)),
        ),
        DataType::Boolean => out.extend(
            col.as_boolean()
                .iter()
                .map(|v| v.map_or(NULL_KEY, u64::from)),
        ),
        DataType::Utf8 => strings!(col.as_string::<i32>()),
        DataType::LargeUtf8 => strings!(col.as_string::<i64>()),
        DataType::Utf8View => strings!(col.as_string_view()),
        DataType::Dictionary(_, _) => {
            let dict = col.as_any_dictionary();
            let mut values = Vec::new();
            keys(dict.values(), &mut values);
            let codes = dict.normalized_keys();
            out.extend(codes.iter().enumerate().map(|(r, &k)| {
                if col.is_null(r) {
                    NULL_KEY
                } else {
                    values.get(k).copied().unwrap_or(NULL_KEY)
                }
            }));
        }
        _ => out.resize(col.len(), NULL_KEY),
    }
}
