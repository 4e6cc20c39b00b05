//! A named log's rows as JSON objects of its schema's columns: what `elastrec replay
//! --format json` sends to Kafka, and what an online job with the same schema decodes
//! with [`crate::named_json`] into the sample a file reader would give.
//!
//! Values are the file's own, before any transform: a dense column's number (`null`
//! where the file has none), an id as the file stores it (an integer, a string, a
//! boolean), a list as an array (null items kept as `null`, which the decoder drops), a
//! label as 0 or 1. A CSV field is written as its kind reads it: numbers as numbers, a
//! plainly written integer id as that integer, other ids as strings, a list field split
//! at the list separator (an empty item as `null`, which the decoder drops and counts as
//! the CSV reader does). Only the schema's columns are written:
//! its labels, sample weight, features and per-id weights.
//!
//! A value the decoder could not read back the same (NaN, an infinity, a bad label) is an
//! error naming the file, row and column; nothing is skipped silently.

use crate::error::{DataError, FieldError, Result};
use crate::named::{missing_column, Columns};
use crate::named_csv::{parse_label, parse_number, parse_weight, read_header, Splitter};
use crate::parquet_io::{decode_label, open_projected};
use crate::reader::{detect_format, FileFormat};
use crate::schema::{plain_integer, FeatureKind, Schema};
use crate::text::{open_input, Line, Lines};
use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::DataType;
use serde_json::{Map, Number, Value};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};

/// What a column holds for the schema, which decides how its values are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Label,
    SampleWeight,
    Dense,
    Id,
    Ids,
    ItemWeights,
}

/// The schema's columns once each, in the schema's order, with their roles.
fn columns_of(schema: &Schema) -> Vec<(String, Role)> {
    let mut out: Vec<(String, Role)> = Vec::new();
    let mut add = |name: &str, role| {
        if !out.iter().any(|(n, _)| n == name) {
            out.push((name.to_string(), role));
        }
    };
    for l in &schema.labels {
        add(l, Role::Label);
    }
    if let Some(w) = &schema.weight {
        add(w, Role::SampleWeight);
    }
    for f in &schema.features {
        match f.kind {
            FeatureKind::Dense => add(f.column(), Role::Dense),
            // A categorical feature whose chain starts by bucketizing reads a number.
            FeatureKind::Categorical if crate::chain::reads_numbers(f) => {
                add(f.column(), Role::Dense)
            }
            FeatureKind::Categorical => add(f.column(), Role::Id),
            FeatureKind::Bag | FeatureKind::Sequence => {
                add(f.column(), Role::Ids);
                if let Some(w) = &f.weights {
                    add(w, Role::ItemWeights);
                }
            }
        }
    }
    out
}

/// Reads a named log (Parquet, or CSV/TSV with a header, plain or gzip) row by row as
/// JSON objects of `schema`'s columns.
pub struct JsonRows {
    path: PathBuf,
    columns: Vec<(String, Role)>,
    source: Source,
    /// Rows decoded and not yet returned.
    ready: VecDeque<Map<String, Value>>,
}

// One per open file: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum Source {
    Parquet {
        inner: Option<crate::row_groups::Decoder>,
        /// 0-based file row of the next decoded batch's first row.
        next_row: u64,
    },
    Csv {
        lines: Lines,
        split: Splitter,
        /// Each schema column's position in the header.
        at: Vec<usize>,
        header_len: usize,
        list_separator: u8,
    },
}

impl std::fmt::Debug for JsonRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonRows")
            .field("path", &self.path)
            .finish()
    }
}

impl JsonRows {
    /// Opens `path`, checking that it holds every column of `schema`, each of a type its
    /// kind takes (an error names the file and the column), as the file reader does.
    pub fn open(path: &Path, schema: &Schema) -> Result<Self> {
        let columns = columns_of(schema);
        let source = if detect_format(path)? == FileFormat::Parquet {
            // The file reader's own checks: every column there, each of a type its kind
            // takes; and its projection.
            let opened = open_projected(path, None, |file| {
                let chains = crate::chain::Chains::of(schema);
                Ok(Columns::resolve(path, file, schema, &chains)?.project().0)
            })?;
            Source::Parquet {
                inner: opened.inner,
                next_row: 0,
            }
        } else {
            let (header, delimiter) = read_header(path, &schema.csv)?;
            let position = |name: &str| header.iter().position(|h| h == name);
            Columns::locate(schema, |name, role| {
                position(name).ok_or_else(|| {
                    let have: Vec<&str> = header.iter().map(String::as_str).collect();
                    missing_column(path, name, role, &have)
                })
            })?;
            let at = columns
                .iter()
                .map(|(name, _)| position(name).expect("located above"))
                .collect();
            let (input, _) = open_input(path)?;
            let mut lines = Lines::new(path, input, 1, u64::MAX, None);
            lines.next()?; // the header
            Source::Csv {
                lines,
                split: Splitter::new(delimiter),
                at,
                header_len: header.len(),
                list_separator: schema.csv.list_separator as u8,
            }
        };
        Ok(Self {
            path: path.to_path_buf(),
            columns,
            source,
            ready: VecDeque::new(),
        })
    }

    /// The next row; `None` at the end of the file.
    pub fn next_row(&mut self) -> Result<Option<Map<String, Value>>> {
        if self.ready.is_empty() {
            match &mut self.source {
                Source::Parquet { inner, next_row } => {
                    let Some(reader) = inner.as_mut() else {
                        return Ok(None);
                    };
                    let what = format!("decoding the rows from {next_row}");
                    let path = &self.path;
                    match reader.next_batch(path, &what).transpose() {
                        Ok(Some(b)) => {
                            let first = *next_row;
                            *next_row += b.num_rows() as u64;
                            rows_of_batch(path, &b, first, &self.columns, &mut self.ready)?;
                        }
                        Ok(None) => *inner = None,
                        Err(e) => {
                            *inner = None;
                            return Err(e);
                        }
                    }
                }
                Source::Csv {
                    lines,
                    split,
                    at,
                    header_len,
                    list_separator,
                } => match lines.next()? {
                    None => {}
                    Some(Line::TooLong(line)) => {
                        return Err(DataError::LineTooLong {
                            path: self.path.clone(),
                            line,
                            limit: crate::text::MAX_LINE_BYTES,
                        })
                    }
                    Some(Line::Text(line, text)) => {
                        split.split(text);
                        let row = csv_row(split, at, *header_len, *list_separator, &self.columns)
                            .map_err(|(column, reason)| DataError::BadField {
                            path: self.path.clone(),
                            line,
                            column,
                            reason,
                        })?;
                        self.ready.push_back(row);
                    }
                },
            }
        }
        Ok(self.ready.pop_front())
    }
}

/// The rows of one decoded Arrow batch (its first row is file row `first`).
fn rows_of_batch(
    path: &Path,
    b: &RecordBatch,
    first: u64,
    columns: &[(String, Role)],
    out: &mut VecDeque<Map<String, Value>>,
) -> Result<()> {
    let mut values = Vec::with_capacity(columns.len());
    for (name, role) in columns {
        let col = b
            .column_by_name(name)
            .expect("projected when the file opened");
        let decoded = column_values(col, *role).map_err(|(i, reason)| DataError::BadValue {
            path: path.to_path_buf(),
            row: first + i as u64,
            column: name.clone(),
            reason,
        })?;
        values.push(decoded);
    }
    for r in 0..b.num_rows() {
        let mut row = Map::with_capacity(columns.len());
        for ((name, _), col) in columns.iter().zip(&mut values) {
            row.insert(name.clone(), std::mem::take(&mut col[r]));
        }
        out.push_back(row);
    }
    Ok(())
}

/// Every value of an Arrow column as JSON, read for `role`; an error names the row.
fn column_values(
    col: &ArrayRef,
    role: Role,
) -> std::result::Result<Vec<Value>, (usize, FieldError)> {
    match role {
        Role::Label => (0..col.len())
            .map(|i| decode_label(col, i).map(Value::from).map_err(|e| (i, e)))
            .collect(),
        Role::SampleWeight | Role::Dense => numbers(col),
        Role::Id => Ok(ids(col)),
        Role::Ids | Role::ItemWeights => {
            let (offsets, items): (Vec<usize>, &ArrayRef) = match col.data_type() {
                DataType::List(_) => {
                    let l = col.as_list::<i32>();
                    (
                        l.offsets().iter().map(|&o| o as usize).collect(),
                        l.values(),
                    )
                }
                DataType::LargeList(_) => {
                    let l = col.as_list::<i64>();
                    (
                        l.offsets().iter().map(|&o| o as usize).collect(),
                        l.values(),
                    )
                }
                other => {
                    return Err((
                        0,
                        FieldError::BadCategory(format!("a {other} column is no list")),
                    ))
                }
            };
            let mut item_values = if role == Role::Ids {
                ids(items)
            } else {
                numbers(items).map_err(|(_, e)| (0, e))?
            };
            let mut out = Vec::with_capacity(col.len());
            for i in 0..col.len() {
                let (start, end) = (offsets[i], offsets[i + 1]);
                if col.is_null(i) || end > item_values.len() || start > end {
                    out.push(Value::Null);
                } else {
                    out.push(Value::Array(
                        item_values[start..end]
                            .iter_mut()
                            .map(std::mem::take)
                            .collect(),
                    ));
                }
            }
            Ok(out)
        }
    }
}

/// A numeric or boolean column's values (null stays null); NaN and infinities are refused.
fn numbers(col: &ArrayRef) -> std::result::Result<Vec<Value>, (usize, FieldError)> {
    macro_rules! prim {
        ($t:ty, $conv:expr) => {
            col.as_primitive::<$t>()
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    None => Ok(Value::Null),
                    Some(v) => {
                        let x: f64 = $conv(v);
                        Number::from_f64(x)
                            .map(Value::Number)
                            .ok_or((i, FieldError::NotFinite(x.to_string())))
                    }
                })
                .collect()
        };
    }
    macro_rules! int {
        ($t:ty) => {
            Ok(col
                .as_primitive::<$t>()
                .iter()
                .map(|v| v.map_or(Value::Null, Value::from))
                .collect())
        };
    }
    match col.data_type() {
        DataType::Int8 => int!(Int8Type),
        DataType::Int16 => int!(Int16Type),
        DataType::Int32 => int!(Int32Type),
        DataType::Int64 => int!(Int64Type),
        DataType::UInt8 => int!(UInt8Type),
        DataType::UInt16 => int!(UInt16Type),
        DataType::UInt32 => int!(UInt32Type),
        DataType::UInt64 => int!(UInt64Type),
        DataType::Float16 => prim!(Float16Type, |v| f64::from(f32::from(v))),
        DataType::Float32 => prim!(Float32Type, f64::from),
        DataType::Float64 => prim!(Float64Type, |v: f64| v),
        DataType::Boolean => Ok(col
            .as_boolean()
            .iter()
            .map(|v| v.map_or(Value::Null, |b| Value::from(u8::from(b))))
            .collect()),
        other => Err((0, FieldError::BadNumber(format!("a {other} column")))),
    }
}

/// An id column's values as the file stores them (null stays null).
fn ids(col: &ArrayRef) -> Vec<Value> {
    macro_rules! int {
        ($t:ty) => {
            col.as_primitive::<$t>()
                .iter()
                .map(|v| v.map_or(Value::Null, Value::from))
                .collect()
        };
    }
    macro_rules! strings {
        ($a:expr) => {
            $a.iter()
                .map(|v| v.map_or(Value::Null, |s| Value::String(s.to_string())))
                .collect()
        };
    }
    match col.data_type() {
        DataType::Int8 => int!(Int8Type),
        DataType::Int16 => int!(Int16Type),
        DataType::Int32 => int!(Int32Type),
        DataType::Int64 => int!(Int64Type),
        DataType::UInt8 => int!(UInt8Type),
        DataType::UInt16 => int!(UInt16Type),
        DataType::UInt32 => int!(UInt32Type),
        DataType::UInt64 => int!(UInt64Type),
        DataType::Boolean => col
            .as_boolean()
            .iter()
            .map(|v| v.map_or(Value::Null, Value::Bool))
            .collect(),
        DataType::Utf8 => strings!(col.as_string::<i32>()),
        DataType::LargeUtf8 => strings!(col.as_string::<i64>()),
        DataType::Utf8View => strings!(col.as_string_view()),
        DataType::Dictionary(_, _) => {
            let dict = col.as_any_dictionary();
            let values = ids(dict.values());
            dict.normalized_keys()
                .iter()
                .enumerate()
                .map(|(r, &k)| match values.get(k) {
                    Some(v) if !col.is_null(r) => v.clone(),
                    _ => Value::Null,
                })
                .collect()
        }
        // The file was opened through the schema's type checks: nothing else reaches here.
        _ => vec![Value::Null; col.len()],
    }
}

/// One CSV line (already split) as JSON; an error names the column.
fn csv_row(
    split: &Splitter,
    at: &[usize],
    header_len: usize,
    list_separator: u8,
    columns: &[(String, Role)],
) -> std::result::Result<Map<String, Value>, (String, FieldError)> {
    if split.len() != header_len {
        let column = columns
            .iter()
            .zip(at)
            .find(|(_, &i)| i >= split.len())
            .map_or_else(|| "(past the last)".to_string(), |((n, _), _)| n.clone());
        return Err((
            column,
            FieldError::FieldCount {
                expected: header_len,
                found: split.len(),
            },
        ));
    }
    let mut row = Map::with_capacity(columns.len());
    for ((name, role), &i) in columns.iter().zip(at) {
        let field = split.field(i).trim_ascii();
        let named = |e: FieldError| (name.clone(), e);
        let number = |x: f32| Number::from_f64(f64::from(x)).map_or(Value::Null, Value::Number);
        let value = match role {
            Role::Label => Value::from(parse_label(field).map_err(named)? as u8),
            Role::SampleWeight => number(parse_weight(field).map_err(named)?),
            Role::Dense if field.is_empty() => Value::Null,
            Role::Dense => number(parse_number(field).map_err(named)?),
            Role::Id if field.is_empty() => Value::Null,
            Role::Id => text_id(field),
            // An empty field is an empty list; an empty item is a null one, which the
            // decoder drops and counts as the CSV reader does (its weight still pairs).
            Role::Ids | Role::ItemWeights if field.is_empty() => Value::Array(Vec::new()),
            Role::Ids => Value::Array(
                field
                    .split(|&b| b == list_separator)
                    .map(<[u8]>::trim_ascii)
                    .map(|item| {
                        if item.is_empty() {
                            Value::Null
                        } else {
                            text_id(item)
                        }
                    })
                    .collect(),
            ),
            Role::ItemWeights => Value::Array(
                field
                    .split(|&b| b == list_separator)
                    .map(|w| parse_number(w).map(number))
                    .collect::<std::result::Result<_, _>>()
                    .map_err(named)?,
            ),
        };
        row.insert(name.clone(), value);
    }
    Ok(row)
}

/// A text id: a plainly written integer as that number (it keys the same either way),
/// any other text as a string.
fn text_id(t: &[u8]) -> Value {
    match plain_integer(t) {
        Some(v) => Value::from(v),
        None => Value::String(String::from_utf8_lossy(t).into_owned()),
    }
}
